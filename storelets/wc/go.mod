module locus/storelets/wc

go 1.22
