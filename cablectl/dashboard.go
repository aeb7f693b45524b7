package cablectl

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/adminconfig"
	"github.com/cablemesh/cablemesh/cablectl/dashboard"
)

// dashboardFlags are `cablectl dashboard`'s own flags.
type dashboardFlags struct {
	listen   string
	open     bool
	interval time.Duration
}

// The bounds of --interval: faster than 100 ms only loads the broker; slower than a second is not
// live any more, yet a person may want that of a remote broker.
const (
	minDashboardInterval = 100 * time.Millisecond
	maxDashboardInterval = time.Minute
)

func newDashboardCmd(g *globalFlags) *cobra.Command {
	df := &dashboardFlags{}
	cmd := &cobra.Command{
		Use:   "dashboard",
		Short: "Serve a read-only web dashboard of the whole mesh (needs the admin credential, --config)",
		Long: `dashboard serves a web dashboard of the mesh on --listen: the pairs of clusters (a matrix coloured by
state, with driver and RTT, and a graph), the clusters (gateways online, agent versions, certificate
expiry), the connection policies (origin, priority, the pairs each decides or loses), the services
(VIPs, exporting clusters, conflicts) and the recent events (pairs down and up, failovers, policy
changes). It reads the broker with the admin credential every --interval and pushes each change to
the open pages (server-sent events); it never writes. GET /api/v1/mesh answers the same data as JSON.

It prints its URL, which carries an access token for this run: the dashboard shows what the admin
credential reads, so whoever reaches its port needs the token too (the page keeps it in a cookie;
scripts send Authorization: Bearer TOKEN). Every asset is in the binary: no internet needed.
It serves until interrupted.`,
		Example: "  cablectl dashboard\n  cablectl dashboard --listen 127.0.0.1:9000 --open\n  curl -H \"Authorization: Bearer $TOKEN\" http://127.0.0.1:8490/api/v1/mesh",
		Args:    cobra.NoArgs,
	}
	f := newAdminFlags(g, cmd)
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := df.check(); err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return runDashboard(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), f, df)
	}
	cmd.Flags().StringVar(&df.listen, "listen", "127.0.0.1:8490", "address the dashboard serves on, host:port (port 0: any free port)")
	cmd.Flags().BoolVar(&df.open, "open", false, "open the dashboard in a browser (xdg-open, where there is one)")
	cmd.Flags().DurationVar(&df.interval, "interval", time.Second, "how often to read the broker (100ms to 1m)")
	return cmd
}

func (df *dashboardFlags) check() error {
	if _, _, err := net.SplitHostPort(df.listen); err != nil {
		return usagef("--listen %q: want host:port: %v", df.listen, err)
	}
	if df.interval < minDashboardInterval || df.interval > maxDashboardInterval {
		return usagef("--interval %s: want %s to %s", df.interval, minDashboardInterval, maxDashboardInterval)
	}
	return nil
}

// adminConfig loads the admin credential, with --broker overriding its address, as withBroker.
func (f *adminFlags) adminConfig() (*adminconfig.Config, error) {
	cfg, err := adminconfig.Load(f.config)
	if err != nil {
		return nil, err
	}
	if f.broker != "" {
		cfg.Broker = f.broker
		if err := cfg.Validate(); err != nil {
			return nil, usagef("--broker: %v", err)
		}
	}
	return cfg, nil
}

// runDashboard dials the broker once (the connection lives as long as the dashboard), starts the
// poller and serves until ctx ends.
func runDashboard(ctx context.Context, stdout, stderr io.Writer, f *adminFlags, df *dashboardFlags) error {
	cfg, err := f.adminConfig()
	if err != nil {
		return err
	}
	conn, err := adminconfig.Dial(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	log := slog.New(slog.NewTextHandler(stderr, nil))
	client := apiv1.NewAdminClient(conn)
	poller := dashboard.NewPoller(client, dashboardLinks(client), df.interval, log)

	ln, err := net.Listen("tcp", df.listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", df.listen, err)
	}
	token, err := newDashboardToken()
	if err != nil {
		ln.Close()
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go poller.Run(ctx)
	srv := &http.Server{Handler: dashboard.NewServer(poller, token, ctx.Done()), ReadHeaderTimeout: 10 * time.Second}
	url := fmt.Sprintf("http://%s/?token=%s", ln.Addr(), token)
	fmt.Fprintf(stdout, "Cablemesh dashboard of broker %s: %s\n", cfg.Broker, url)
	if df.open {
		openBrowser(ctx, stderr, url)
	}
	return dashboard.Serve(ctx, srv, func() error { return srv.Serve(ln) })
}

// newDashboardToken is the access token of one run: 128 random bits, hex.
func newDashboardToken() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("dashboard access token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// openBrowser asks the desktop for a browser (xdg-open); without one it says so and the
// dashboard serves on, its URL printed.
func openBrowser(ctx context.Context, stderr io.Writer, url string) {
	if _, err := exec.LookPath("xdg-open"); err != nil {
		fmt.Fprintln(stderr, "--open: no browser here (xdg-open not found); open the URL above yourself")
		return
	}
	c := exec.CommandContext(ctx, "xdg-open", url)
	if err := c.Start(); err != nil {
		fmt.Fprintf(stderr, "--open: %v; open the URL above yourself\n", err)
		return
	}
	go func() { _ = c.Wait() }()
}
