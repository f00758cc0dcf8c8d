module locus/storelets/hostile

go 1.22
