module github.com/cablemesh/cablemesh/tests/helm

go 1.26.8

replace github.com/cablemesh/cablemesh => ../..

require (
	github.com/cablemesh/cablemesh v0.0.0 // indirect
	helm.sh/helm/v3 v3.22.0 // indirect
)
