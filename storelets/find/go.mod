module locus/storelets/find

go 1.22
