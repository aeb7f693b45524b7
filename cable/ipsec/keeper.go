package ipsec

import (
	"context"
	"slices"
	"time"
)

// The keeper re-initiates the connections this node initiates when they have no IKE_SA (see
// keep). It is the one goroutine the driver runs itself besides our charon's supervisor and log
// follower.

// The keeper's clock. keepEvery is its period while every connection it watches is established
// (or charon is still working on one): it bounds how late the keeper notices that the peer
// deleted an IKE_SA (a restarting responder), and a list-sas over a unix socket each second costs
// next to nothing. firstInitRetry is the wait after a connection is loaded or
// after the first initiate of a series, doubling per initiate up to maxInitBackoff, so a peer
// that has not loaded its side yet is asked again within a fraction of a second, and one that
// refuses for good is not asked every few seconds forever. lossGrace is how long the keeper
// waits before initiating again when an established IKE_SA has gone: the peer deleted it, most
// likely because its agent is removing this connection, and ours is about to do the same.
const (
	keepEvery      = time.Second
	firstInitRetry = 200 * time.Millisecond
	maxInitBackoff = time.Minute
	lossGrace      = time.Second
	// minKeepWait keeps a misbehaving schedule from spinning the keeper.
	minKeepWait = 10 * time.Millisecond
	// keeperErrorWait is the keeper's period while charon does not answer.
	keeperErrorWait = 5 * time.Second
	// keeperCallTimeout bounds one look of the keeper (it holds d.mu meanwhile): a charon that
	// hangs must not hold up the driver for defaultCallTimeout at every look.
	keeperCallTimeout = 5 * time.Second
)

// nextInitBackoff is the wait after an initiate, given the wait after the one before (0 for the
// first initiate of a series): firstInitRetry, then doubling, capped at maxInitBackoff.
func nextInitBackoff(prev time.Duration) time.Duration {
	if prev <= 0 {
		return firstInitRetry
	}
	return min(2*prev, maxInitBackoff)
}

// startKeeper starts the keeper goroutine under life, the context Close and Cleanup cancel; d.wg,
// which they wait for, owns it. It runs keep when keep asked to be run again, and at once when
// kicked (a connection was loaded). Called with d.mu held.
func (d *Driver) startKeeper(life context.Context) {
	kick := make(chan struct{}, 1)
	d.kickKeeper = kick
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		t := time.NewTimer(keepEvery)
		defer t.Stop()
		for {
			select {
			case <-life.Done():
				return
			case <-t.C:
			case <-kick:
			}
			t.Reset(d.keep(life))
		}
	}()
}

// kick makes the keeper look at its connections now. Called with d.mu held; never blocks.
func (d *Driver) kick() {
	if d.kickKeeper == nil {
		return
	}
	select {
	case d.kickKeeper <- struct{}{}:
	default:
	}
}

// keep initiates every connection this node initiates that has no IKE_SA at all, and returns
// how long to wait before the next look. charon's start_action only fires when a connection is
// loaded, and a definitive answer from the peer (NO_PROPOSAL_CHOSEN while the peer has not
// loaded its side yet, AUTHENTICATION_FAILED while its key is not there yet) destroys the IKE_SA
// and ends the attempt for good even with keyingtries 0. So an absent IKE_SA is the sign of
// such a failure: this is read from list-sas, a level rather than an event, so nothing is
// missed across a charon restart or a dropped event subscription. A connecting IKE_SA is left
// alone (charon retransmits to a silent peer itself) and looked at again soon. The initiate is
// asynchronous (timeout -1): charon reports the outcome in list-sas.
func (d *Driver) keep(ctx context.Context) time.Duration {
	ctx, cancel := context.WithTimeout(ctx, keeperCallTimeout)
	defer cancel()
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialised {
		return keepEvery
	}
	d.keepTSAddresses()
	wait := keepEvery
	initiator := false
	for _, c := range d.conns {
		initiator = initiator || c.initiates()
	}
	if !initiator {
		return wait
	}
	evs, err := d.client.stream(ctx, "list-sas", "list-sa", map[string]any{"noblock": "yes"})
	if err != nil {
		// charon is down or restarting: its supervisor's replay kicks the keeper once the new
		// one holds the connections again, so look less often meanwhile.
		d.log.Warn("keeper: list SAs", "err", err)
		return keeperErrorWait
	}
	sas := parseSAs(evs)
	now := d.now()
	for name, c := range d.conns {
		if !c.initiates() {
			continue
		}
		due := keepAction(c, sas[name], now)
		if c.up && c.rejoin {
			c.rejoin = false
			d.log.Info("connection up again after the charon restart", "cluster", c.want.Cluster, "name", name)
		}
		if due.initiate {
			d.initiates.Add(1)
			if _, err := d.client.stream(ctx, "initiate", "control-log", map[string]any{"child": name, "ike": name, "timeout": "-1"}); err != nil {
				d.log.Warn("keeper: initiate", "cluster", c.want.Cluster, "err", err)
			}
		}
		wait = min(wait, max(due.after, minKeepWait))
	}
	return wait
}

// keepDecision is what keepAction decided for one connection.
type keepDecision struct {
	initiate bool          // send an initiate now
	after    time.Duration // look at the connection again after this
}

// keepAction updates c's schedule from the IKE_SAs charon holds for it at now and decides
// whether to initiate. Pure, so the schedule is table-tested.
func keepAction(c *loadedConn, sas []ikeSA, now time.Time) keepDecision {
	established := slices.ContainsFunc(sas, func(sa ikeSA) bool { return slices.Contains(ikeUsable, sa.State) })
	switch {
	case established:
		c.up, c.initBackoff, c.nextInitiate = true, 0, time.Time{}
		return keepDecision{after: keepEvery}
	case len(sas) > 0:
		// Connecting (or being deleted): charon is at work; look again as soon as a refusal
		// could have ended it.
		return keepDecision{after: min(max(c.initBackoff, firstInitRetry), keepEvery)}
	case c.up:
		// An established IKE_SA went: the peer deleted it. Give our own agent lossGrace to
		// remove the connection too before asking the peer again.
		c.up, c.initBackoff, c.nextInitiate = false, 0, now.Add(lossGrace)
		return keepDecision{after: lossGrace}
	case now.Before(c.nextInitiate):
		return keepDecision{after: c.nextInitiate.Sub(now)}
	}
	c.initBackoff = nextInitBackoff(c.initBackoff)
	c.nextInitiate = now.Add(c.initBackoff)
	// Look again soon whatever the backoff: to see the outcome (a refusal comes within a round
	// trip), and above all to see the IKE_SA established, so that a later delete by the peer is
	// taken for what it is (lossGrace) and not for one more refusal.
	return keepDecision{initiate: true, after: firstInitRetry}
}

// initiates reports whether the keeper initiates c: this end is the pair's initiator, or a
// restarted charon has to rejoin the peer (loadedConn.rejoin).
func (c *loadedConn) initiates() bool { return c.want.Initiator || c.rejoin }

// scheduleRejoin sets the keeper's schedule for a connection loaded into a restarted charon:
// the initiator's start_action sends an IKE_SA_INIT at once (scheduleAfterLoad); a responder is
// marked to rejoin and is initiated by the keeper now, not after firstInitRetry.
func (c *loadedConn) scheduleRejoin(now time.Time) {
	c.scheduleAfterLoad(now)
	if !c.want.Initiator {
		c.rejoin, c.nextInitiate = true, time.Time{}
	}
}

// scheduleAfterLoad sets the keeper's schedule for a connection charon has just loaded: charon's
// start_action sends the first IKE_SA_INIT at once, and if the peer refuses it (it has not loaded
// its side yet) the keeper initiates again firstInitRetry later, then backs off.
func (c *loadedConn) scheduleAfterLoad(now time.Time) {
	c.nextInitiate, c.initBackoff, c.up = now.Add(firstInitRetry), 0, false
}
