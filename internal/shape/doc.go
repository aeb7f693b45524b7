// Package shape holds tests of the repository's shape: file sizes, the agent root's size and
// gofmt, so that what a careful reading asked of the code once stays true.
package shape
