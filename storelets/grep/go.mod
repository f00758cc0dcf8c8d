module locus/storelets/grep

go 1.22
