// Package shape holds tests of the repository's shape: file sizes, the agent root's size, gofmt,
// and that no agent component holds the whole config (only its static part, and its live part as
// it changes), so that what a careful reading asked of the code once stays true.
package shape
