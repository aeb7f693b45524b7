package dashboard

import (
	"context"
	"crypto/subtle"
	"embed"
	"fmt"
	"io/fs"
	"net/http"
	"strconv"
	"time"
)

//go:embed assets
var assets embed.FS

// CookieName holds the access token in the browser once it opened the printed URL.
const CookieName = "cablemesh_dashboard"

// keepAlive is how often the event stream sends a comment when nothing changed, so that proxies
// and the browser keep the connection open.
const keepAlive = 15 * time.Second

// Server serves the pages, GET /api/v1/mesh and the event stream GET /api/v1/stream. It is
// read-only: every method but GET and HEAD is refused (405). With a token, every request needs
// it (the cookie the printed URL sets, `Authorization: Bearer`, or ?token=): the dashboard shows
// what the admin credential reads, and whoever can reach its port should not read it without.
type Server struct {
	poller *Poller
	token  string
	// done ends the event streams, so that http.Server.Shutdown does not wait for them.
	done <-chan struct{}
	mux  *http.ServeMux
}

// NewServer serves p's documents. token "" serves without one (tests); done ends the streams.
func NewServer(p *Poller, token string, done <-chan struct{}) *Server {
	s := &Server{poller: p, token: token, done: done, mux: http.NewServeMux()}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		panic(err) // the embedded tree is part of the binary: a build error, not an input
	}
	files := http.FileServerFS(static)
	s.mux.Handle("GET /{$}", files)
	s.mux.Handle("GET /app.js", files)
	s.mux.Handle("GET /style.css", files)
	s.mux.HandleFunc("GET /api/v1/mesh", s.serveMesh)
	s.mux.HandleFunc("GET /api/v1/stream", s.serveStream)
	return s
}

// ServeHTTP refuses what is not a read, checks the token, then routes.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, fmt.Sprintf("method %s not allowed: the dashboard is read-only", r.Method), http.StatusMethodNotAllowed)
		return
	}
	if !s.authorized(w, r) {
		return
	}
	s.mux.ServeHTTP(w, r)
}

// authorized checks the request's token. A page opened with ?token= gets the cookie and is sent
// to the same page without the token, so that it does not stay in the address bar.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request) bool {
	if s.token == "" {
		return true
	}
	if q := r.URL.Query().Get("token"); q != "" && s.match(q) {
		http.SetCookie(w, &http.Cookie{Name: CookieName, Value: s.token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
		if r.URL.Path == "/" {
			http.Redirect(w, r, "/", http.StatusSeeOther)
			return false
		}
		return true
	}
	if c, err := r.Cookie(CookieName); err == nil && s.match(c.Value) {
		return true
	}
	if a := r.Header.Get("Authorization"); len(a) > 7 && a[:7] == "Bearer " && s.match(a[7:]) {
		return true
	}
	http.Error(w, "this dashboard needs its access token: open the URL `cablectl dashboard` printed (it carries ?token=), or send Authorization: Bearer <token>", http.StatusUnauthorized)
	return false
}

func (s *Server) match(got string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(s.token)) == 1
}

func (s *Server) serveMesh(w http.ResponseWriter, _ *http.Request) {
	b, _ := s.poller.Current()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// serveStream is the server-sent event stream: an event "mesh" carrying the whole document at
// once and after every change. The document is what the pages draw: sending it whole keeps the
// page's state exactly the server's, with nothing to merge.
func (s *Server) serveStream(w http.ResponseWriter, r *http.Request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	if r.Method == http.MethodHead {
		return
	}
	changed, cancel := s.poller.Subscribe()
	defer cancel()
	tick := time.NewTicker(keepAlive)
	defer tick.Stop()
	var sent uint64
	for {
		if b, seq := s.poller.Current(); seq != sent {
			if _, err := fmt.Fprintf(w, "id: %s\nevent: mesh\ndata: %s\n\n", strconv.FormatUint(seq, 10), b); err != nil {
				return
			}
			fl.Flush()
			sent = seq
		}
		select {
		case <-r.Context().Done():
			return
		case <-s.done:
			return
		case <-changed:
		case <-tick.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil {
				return
			}
			fl.Flush()
		}
	}
}

// Serve runs srv until ctx ends, then shuts it down (streams end at once, other requests get
// a few seconds).
func Serve(ctx context.Context, srv *http.Server, serve func() error) error {
	errc := make(chan error, 1)
	go func() { errc <- serve() }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shut the dashboard down: %w", err)
	}
	if err := <-errc; err != nil && err != http.ErrServerClosed {
		return err
	}
	return nil
}
