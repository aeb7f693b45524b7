package ipsec

import "time"

// The driver persists no connection: the pre-shared keys must never reach a file, and charon
// itself (list-conns, and the key ids of get-shared, see keyID) is the record of what is loaded,
// also for a driver that adopted a charon an earlier agent run left. What the driver keeps is in
// memory, to load it again into a restarted charon and to judge what charon reports.

// loadedConn is a connection this driver loaded into charon.
type loadedConn struct {
	want desiredConn
	// keyID is the id the key was loaded under: it binds the key and the load-conn message.
	keyID    string
	psk      []byte // kept to load it again into a restarted charon; never logged
	loadedAt time.Time
	// The keeper's schedule for this connection (see keep): next initiate not before
	// nextInitiate; initBackoff is the wait after the last initiate (nextInitBackoff); up says
	// the keeper last saw an established IKE_SA.
	nextInitiate time.Time
	initBackoff  time.Duration
	up           bool
	// rejoin makes the keeper initiate this connection although this end only responds, until
	// an IKE_SA is up: set when a restarted charon is given the connection again. The peer's
	// charon still holds an IKE_SA with the dead one and, until its dead peer detection gives
	// up (about 35 s), neither initiates nor sees anything wrong; a new IKE_SA from this end
	// replaces the stale one at once (unique=replace).
	rejoin bool
}

// forget drops the connection name and wipes its key. Called with d.mu held.
func (d *Driver) forget(name string) {
	if c, ok := d.conns[name]; ok {
		clear(c.psk)
		delete(d.conns, name)
	}
}

// forgetAll drops every connection and wipes their keys. Called with d.mu held.
func (d *Driver) forgetAll() {
	for _, c := range d.conns {
		clear(c.psk)
	}
	d.conns = map[string]*loadedConn{}
}
