package statusapi

import "time"

// ConfigStatus is the agent config in force: the agent re-reads its file when it changes and
// applies what can change live (agent/reload.go).
type ConfigStatus struct {
	// Path is the config file the agent watches.
	Path string `json:"path"`
	// Revision counts the configs applied since the agent started: 1 is the file it started
	// with, each applied change adds one. A refused change leaves it as it was.
	Revision int `json:"revision"`
	// Hash is "sha256:<hex>" of the file in force.
	Hash string `json:"hash"`
	// LoadedAt is when the config in force was applied.
	LoadedAt time.Time `json:"loadedAt"`
	// Refused are why the file's latest content is not in force, one entry per field (a change
	// that cannot be applied live, or a file that does not parse: field is then the one the
	// error names, or "" when it names none). Empty when the file is in force.
	Refused []ConfigRefusal `json:"refused,omitempty"`
	// RefusedHash is the hash of the refused content.
	RefusedHash string `json:"refusedHash,omitempty"`
}

// ConfigRefusal is one reason a new config was refused.
type ConfigRefusal struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}
