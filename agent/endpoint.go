package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/retry"
)

// registerLoop registers this gateway's endpoint and renews its lease every heartbeatInterval,
// registering again whenever a heartbeat fails (lease lost, broker restarted without it, ...). It
// ends once the broker refused the agent's certificate for good.
func (a *Agent) registerLoop(ctx context.Context, client apiv1.AgentClient) {
	registered := false
	var quiet brokerclient.RepeatFilter
	// The first registration goes at once: a gateway joining a quiet mesh is not kept waiting for
	// a storm that is not happening. A fleet that starts together is spread by the broker, which
	// answers registrations it has no room for with "busy, come back in a while"
	// (brokerclient.BusyWait), and by the jittered waits of its heartbeats
	// (brokerclient.HeartbeatDelay).
	for {
		if a.certificateRefused() != "" {
			return
		}
		var err error
		gen := a.conn.generation()
		wasRegistered := registered
		if !registered {
			err = a.register(ctx, client)
			registered = err == nil
		} else if err = a.heartbeat(ctx, client); err != nil {
			registered = false
			wasRegistered = false
			if status.Code(err) == codes.NotFound {
				a.log.Info("broker lost this endpoint; registering again")
				if err = a.register(ctx, client); err == nil {
					registered = true
				}
			}
		}
		// Just registered: the first heartbeat comes after a wider random wait (a fleet
		// registers together).
		wait := brokerclient.HeartbeatDelay(a.cfg.HeartbeatInterval)
		if registered && !wasRegistered {
			wait = brokerclient.AfterRegistrationDelay(a.cfg.HeartbeatInterval)
		}
		if ctx.Err() != nil {
			return
		}
		if d, busy := brokerclient.BusyWait(err); busy {
			// The broker answered, it only has no room now: come back when it said, on the
			// same connection.
			a.mu.Lock()
			a.beatOK = false
			a.mu.Unlock()
			a.log.Debug("broker busy; registering again later", "retryIn", d.Round(time.Millisecond).String())
			if !retry.Sleep(ctx, d) {
				return
			}
			continue
		}
		if err != nil && a.refusedForGood(err, gen) {
			a.mu.Lock()
			a.beatOK = false
			a.mu.Unlock()
			return
		}
		a.mu.Lock()
		a.beatOK = err == nil
		watchUp := a.watchUp
		if err == nil {
			a.lastContact = time.Now()
			if a.watchUp {
				a.lastErr = ""
			}
		}
		a.mu.Unlock()
		if err != nil {
			a.setBrokerError(err)
			level := slog.LevelWarn
			if quiet.Repeated(err) {
				level = slog.LevelDebug
			}
			a.log.Log(ctx, level, "endpoint registration or heartbeat failed", "err", err)
		} else {
			quiet.Reset()
			if !watchUp {
				// The broker answers: do not leave the watch waiting out a long backoff.
				a.wakeWatch.Fire()
			}
		}
		if !retry.Sleep(ctx, wait) {
			return
		}
		if err != nil {
			a.redial()
		}
	}
}

func (a *Agent) register(ctx context.Context, client apiv1.AgentClient) error {
	ep := a.endpoint()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sent := time.Now()
	resp, err := client.RegisterEndpoint(brokerclient.AcceptBusy(cctx), &apiv1.RegisterEndpointRequest{Endpoint: ep, LeaseSeconds: int64(a.cfg.LeaseSeconds)})
	if err != nil {
		return fmt.Errorf("register endpoint: %w", err)
	}
	a.clock.observe(sent, time.Now(), resp.GetBrokerTime(), resp.GetBrokerVersion())
	a.ingress.ObserveRegistered(resp.GetEndpoint())
	a.log.Info("endpoint registered", "drivers", strings.Join(ep.GetDrivers(), ","), "address", ep.GetPrivateIp(), "subnets", strings.Join(ep.GetSubnets(), ","))
	return nil
}

func (a *Agent) heartbeat(ctx context.Context, client apiv1.AgentClient) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sent := time.Now()
	resp, err := client.Heartbeat(cctx, &apiv1.HeartbeatRequest{Node: a.cfg.Node})
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	a.clock.observe(sent, time.Now(), resp.GetBrokerTime(), resp.GetBrokerVersion())
	return nil
}

// endpoint is this gateway's record for the broker.
func (a *Agent) endpoint() *apiv1.Endpoint {
	subnets := a.localSubnets()
	private, public := a.endpointAddrs() // the config's, or the Node's on Kubernetes
	ep := &apiv1.Endpoint{
		Cluster:   a.cfg.Cluster,
		Node:      a.cfg.Node,
		PrivateIp: private,
		PublicIp:  public,
	}
	for _, p := range subnets {
		ep.Subnets = append(ep.Subnets, p.String())
	}
	// Only the drivers that run are published: the node does not claim a cable it cannot carry.
	for _, d := range a.cables.Running() {
		le := d.LocalEndpoint()
		ep.Drivers = append(ep.Drivers, d.Name())
		if ep.CablePorts == nil {
			ep.CablePorts = map[string]uint32{}
		}
		ep.CablePorts[d.Name()] = uint32(le.Port)
		ep.SetAttributes(d.Name(), le.Attributes)
	}
	if ip := healthCheckIP(a.localPodCIDRs(), a.opts.InterfaceAddrs()); ip.IsValid() {
		ep.HealthCheckIp = ip.String()
	}
	return ep
}

// healthCheckIP is the first of this node's addresses inside its pod CIDRs.
func healthCheckIP(pods []netip.Prefix, addrs []netip.Addr) netip.Addr {
	for _, a := range addrs {
		for _, p := range pods {
			if p.Contains(a) {
				return a
			}
		}
	}
	return netip.Addr{}
}

func interfaceAddrs() []netip.Addr {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, ifa := range ifas {
		if n, ok := ifa.(*net.IPNet); ok {
			if a, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, a.Unmap())
			}
		}
	}
	return out
}
