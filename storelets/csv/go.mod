module locus/storelets/csv

go 1.22
