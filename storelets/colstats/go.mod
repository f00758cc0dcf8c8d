module locus/storelets/colstats

go 1.22
