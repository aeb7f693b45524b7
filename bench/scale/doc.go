// Package scale measures the broker under a fleet of agents that start at once:
// thousands of simulated agents in this process speak the agent protocol with real mTLS to
// the real cable-broker binary, started as a process with its own data dir (bbolt), or over a
// local etcd (etcd-server from Debian).
//
// Run it (no root needed):
//
//	go test -tags bench -run '^TestScale$' -v -count=1 -timeout 90m ./bench/scale/
//
// or `make bench-scale`. It writes bench/results/scale-<UTC time>.json and .md. Environment:
//
//	CABLEMESH_BIN                 directory holding cable-broker (default: built into a temp dir)
//	CABLEMESH_SCALE_BROKER        the broker builds to measure, side by side in one run:
//	                              LABEL=PATH[@AGENT],... (or one PATH); AGENT is current (the
//	                              agent now: registers at once, honours the broker's busy
//	                              answers with jitter, brokerclient.BusyWait, jittered
//	                              heartbeats, brokerclient.HeartbeatDelay, compressed watch
//	                              messages, watchzstd, link reports of one link per remote
//	                              cluster, reports.go), noreports (current without the
//	                              link reports, as agents were before them), delayed (the
//	                              agent of 98843a3: its first registration up to a second later
//	                              at random, no busy answers),
//	                              uncompressed (delayed without accepting zstd, as agents did
//	                              before it) or fixed (heartbeats every interval from the
//	                              registration, as agents did before the jitter), e.g.
//	                              before=/tmp/old/cable-broker@delayed,after=bin/cable-broker,
//	                              or before=/tmp/main/cable-broker@noreports,after=bin/cable-broker
//	                              for the cost of the link reports (a reporting agent against a
//	                              broker without them makes one call, answered Unimplemented)
//	CABLEMESH_SCALE_BROKER_ARGS   more flags for every broker, e.g. "--metrics-listen
//	                              127.0.0.1:9465 --pprof" to profile it during a run
//	CABLEMESH_SCALE_LABEL         the label of a build given without one (default current)
//	CABLEMESH_SCALE_AGENT         the AGENT of a build given without one (default current)
//	CABLEMESH_SCALE_FLEETS        clusters x gateways, comma-separated (default 100x10,255x20)
//	CABLEMESH_SCALE_STORES        bolt, etcd or both, comma-separated (default bolt,etcd); etcd is
//	                              one etcd-server member on tmpfs (broker/store/etcdtest)
//	CABLEMESH_SCALE_STEADY        seconds of steady state after the start (default 30)
//	CABLEMESH_SCALE_CHANGES       policy changes and endpoint changes measured, each (default 5)
//	CABLEMESH_SCALE_START_TIMEOUT seconds to wait for the fleet to be current (default 240)
//	CABLEMESH_BENCH_RESULTS       results directory (default bench/results)
//	CABLEMESH_SCALE_LOGS          a directory to keep the brokers' logs in
//	                              (broker-LABEL-STORE-CxG.log; default: a temp dir, removed)
//	CABLEMESH_SCALE_GOGC          the simulated fleet's GOGC (default 400; the broker's is its own)
//
// A run, for each fleet, store and build: the broker starts on an empty data dir (or etcd);
// a join token per cluster (--max-nodes its gateways); every agent joins at once (join time);
// then every joined agent dials, opens its watch and registers at once (fleet start: until every
// agent holds every endpoint and cluster; first RegisterEndpoint latency, calls that hit the
// 10 s deadline, snapshot size and time); steady state (heartbeats per second and their
// latency); policy and endpoint changes (from the call to each agent's receipt); a broker
// restart on the same data (from the new process's start to each agent's first message, and
// whether it resumed from its revision or needed a snapshot). The broker's RSS is sampled every
// 100 ms and its CPU read from /proc per phase. The load average is read at the start and once
// the fleet is current (it covers the fleet start, this bench's own load included): on a shared
// machine compare figures only with the load beside them. Calls that failed for another reason
// than their deadline are counted by method, code and message in the notes. The bbolt data dir
// is a temp dir on the machine's disk (every group commit syncs it; TMPDIR=/dev/shm puts it on
// tmpfs, as etcd's, to measure the broker without the disk); etcd runs on tmpfs. Only what makes
// the figures meaningless fails the test (no agent current, agents missing endpoints after the
// restart); the goals are reported, not asserted: the machine is shared.
//
// What a simulated agent does is what cable-agent does on a gateway, in the same order and with
// the same timeouts: join with its cluster's token (brokerclient.Join, a token per cluster with
// --max-nodes the cluster's gateways), dial with its certificate, then at once open its watch
// (since_revision, want_imports with the default selector, resuming from its revision with the
// agent's backoff) and register its endpoint (10 s deadline), heartbeat every 10 s (10 s
// deadline), and send its (empty) exports on every new stream. To stay cheap it decodes watch
// messages only as far as the agent's bookkeeping needs (kind, key, revision of each event; the
// resources are skipped), applies them to a bitset of the mesh's endpoints and clusters, and has
// one goroutine (the watch) plus a timer for its heartbeats.
package scale
