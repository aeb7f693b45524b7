// Package apiv1 holds the broker's protobuf API and its generated Go code.
package apiv1

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative cablemesh.proto
