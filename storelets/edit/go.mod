module locus/storelets/edit

go 1.22
