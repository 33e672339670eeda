// Package peers holds no code of its own: this module pins the upstream
// programs that nri-shim's tests use as reference peers (see go.mod and
// README.md). The file exists so that `go vet ./...` has a package to check:
// with none, it fails with "matched no packages".
package peers
