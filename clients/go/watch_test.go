package gantry

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	gantryv1 "github.com/gantry-dev/gantry/clients/go/gantry/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

const patience = 30 * time.Second

// store is a gateway-store process (GANTRY_STORE_BIN) on fixed ports,
// restartable on the same database.
type store struct {
	fatalf func(format string, args ...any)
	args   []string
	http   string
	grpc   string
	cmd    *exec.Cmd
	log    *os.File
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func inCI() bool {
	ci := os.Getenv("CI")
	return ci != "" && ci != "false" && ci != "0"
}

// TestMain skips the package without a store binary (cargo test runs it
// with one, tests/tests/go_client.rs) and starts the store the examples
// use, named by GANTRY_SERVER as gatewayctl reads it.
func TestMain(m *testing.M) {
	if os.Getenv("GANTRY_STORE_BIN") == "" {
		if inCI() {
			fmt.Fprintln(os.Stderr, "GANTRY_STORE_BIN is not set: cargo test runs these tests with it (tests/tests/go_client.rs)")
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "SKIPPED: GANTRY_STORE_BIN is not set (cargo test --workspace runs these tests with it)")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "gantry-go-examples-")
	if err != nil {
		panic(err)
	}
	s := launch(dir, func(format string, args ...any) { panic(fmt.Sprintf(format, args...)) })
	os.Setenv("GANTRY_SERVER", "http://"+s.grpc)
	code := m.Run()
	s.kill()
	os.RemoveAll(dir)
	os.Exit(code)
}

func startStore(t *testing.T, extra ...string) *store {
	s := launch(t.TempDir(), t.Fatalf, extra...)
	t.Cleanup(s.kill)
	return s
}

// launch starts a store on a SQLite database in dir.
func launch(dir string, fatalf func(string, ...any), extra ...string) *store {
	s := &store{fatalf: fatalf, grpc: freePort(), http: freePort()}
	s.args = append([]string{
		"--listen", s.grpc, "--http-listen", s.http,
		"--database-url", "sqlite://" + filepath.Join(dir, "gantry.db"),
		"--data-dir", dir,
	}, extra...)
	if !strings.Contains(strings.Join(extra, " "), "--tokens-file") {
		s.args = append(s.args, "--allow-unauthenticated")
	}
	log, err := os.Create(filepath.Join(dir, "store.log"))
	if err != nil {
		fatalf("%v", err)
	}
	s.log = log
	s.spawn()
	return s
}

func (s *store) spawn() {
	s.cmd = exec.Command(os.Getenv("GANTRY_STORE_BIN"), s.args...)
	s.cmd.Stderr = s.log
	if err := s.cmd.Start(); err != nil {
		s.fatalf("%v", err)
	}
	waitFor(s.fatalf, "the store is ready", func() bool {
		resp, err := http.Get("http://" + s.http + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// kill is SIGKILL: nothing is flushed or said goodbye.
func (s *store) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

func eventually(t *testing.T, what string, check func() bool) {
	t.Helper()
	waitFor(t.Fatalf, what, check)
}

func waitFor(fatalf func(string, ...any), what string, check func() bool) {
	deadline := time.Now().Add(patience)
	for !check() {
		if time.Now().After(deadline) {
			fatalf("never: %s", what)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// recorder keeps what a subscriber saw: every update, and the cache it
// builds from them.
type recorder struct {
	mu      sync.Mutex
	updates []Update
	cache   map[string]int64
	listing map[string]int64
}

func (r *recorder) handle(u Update) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.updates = append(r.updates, u)
	switch u.Kind {
	case Init:
		r.listing = map[string]int64{}
	case InitPage:
		for _, g := range u.Gateways {
			r.listing[g.GetMetadata().GetName()] = g.GetMetadata().GetResourceVersion()
		}
	case InitDone:
		r.cache, r.listing = r.listing, nil
	case Applied:
		r.cache[u.Gateway.GetMetadata().GetName()] = u.Gateway.GetMetadata().GetResourceVersion()
	case Deleted:
		delete(r.cache, u.Gateway.GetMetadata().GetName())
	}
	return nil
}

func (r *recorder) seen(revision int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.updates) > 0 && r.updates[len(r.updates)-1].Revision >= revision && r.cache != nil
}

func (r *recorder) snapshot() ([]Update, map[string]int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	cache := map[string]int64{}
	for k, v := range r.cache {
		cache[k] = v
	}
	return append([]Update(nil), r.updates...), cache
}

func gateway(name, image string) *gantryv1.Gateway {
	return &gantryv1.Gateway{
		Metadata: &gantryv1.ObjectMeta{Name: name},
		Spec:     &gantryv1.GatewaySpec{Image: image},
	}
}

// writer makes changes and remembers the revision of each.
type writer struct {
	t         *testing.T
	client    gantryv1.GatewayServiceClient
	revisions []int64
}

func (w *writer) create(name string) {
	g, err := w.client.CreateGateway(context.Background(), &gantryv1.CreateGatewayRequest{Gateway: gateway(name, "ghcr.io/acme/gw:1")})
	if err != nil {
		w.t.Fatalf("create %s: %v", name, err)
	}
	w.revisions = append(w.revisions, g.GetMetadata().GetResourceVersion())
}

func (w *writer) update(name string, n int) {
	g, err := w.client.UpdateGateway(context.Background(), &gantryv1.UpdateGatewayRequest{
		Gateway:    gateway(name, fmt.Sprintf("ghcr.io/acme/gw:%d", n)),
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"spec"}},
	})
	if err != nil {
		w.t.Fatalf("update %s: %v", name, err)
	}
	w.revisions = append(w.revisions, g.GetMetadata().GetResourceVersion())
}

func (w *writer) last() int64 { return w.revisions[len(w.revisions)-1] }

// stored is every gateway and its resource_version, as the store lists it.
func stored(t *testing.T, client gantryv1.GatewayServiceClient) map[string]int64 {
	page, err := client.ListGateways(context.Background(), &gantryv1.ListGatewaysRequest{PageSize: 1000})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, g := range page.GetGateways() {
		out[g.GetMetadata().GetName()] = g.GetMetadata().GetResourceVersion()
	}
	return out
}

func connect(t *testing.T, s *store) gantryv1.GatewayServiceClient {
	conn, err := grpc.NewClient(s.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return gantryv1.NewGatewayServiceClient(conn)
}

func equal(a, b map[string]int64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Across a SIGKILL and restart of the store, the subscriber resumes from
// the last revision it saw: every change exactly once, in order.
func TestEveryChangeExactlyOnceAcrossAStoreRestart(t *testing.T) {
	s := startStore(t)
	client := connect(t, s)
	w := &writer{t: t, client: client}
	for i := 0; i < 3; i++ {
		w.create(fmt.Sprintf("gw-%d", i))
	}
	r := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ListThenWatch(ctx, client, WatchOptions{PageSize: 2}, r.handle) }()
	eventually(t, "the first list", func() bool { return r.seen(w.last()) })
	listedAt := w.last()

	for i := 0; i < 3; i++ {
		w.update(fmt.Sprintf("gw-%d", i), 2)
	}
	eventually(t, "the changes before the restart", func() bool { return r.seen(w.last()) })
	s.kill()
	s.spawn()
	w.update("gw-0", 3)
	w.create("gw-3")
	w.update("gw-3", 4)
	eventually(t, "the changes after the restart", func() bool { return r.seen(w.last()) })
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("the loop ended with %v", err)
	}

	updates, cache := r.snapshot()
	var changes []int64
	interrupted := 0
	last := int64(0)
	for _, u := range updates {
		if u.Revision < last {
			t.Fatalf("revision %d after %d: %v", u.Revision, last, updates)
		}
		last = u.Revision
		switch u.Kind {
		case Applied, Deleted:
			changes = append(changes, u.Revision)
		case Interrupted:
			interrupted++
			if u.Err == nil || u.RetryIn <= 0 {
				t.Fatalf("an interruption says why and when: %+v", u)
			}
		case Init:
			if u.Revision != listedAt {
				t.Fatalf("listed again at %d (first list at %d)", u.Revision, listedAt)
			}
		}
	}
	if interrupted == 0 {
		t.Fatal("the restart was not reported")
	}
	want := w.revisions[3:]
	if fmt.Sprint(changes) != fmt.Sprint(want) {
		t.Fatalf("changes delivered %v, made %v", changes, want)
	}
	if got := stored(t, client); !equal(cache, got) {
		t.Fatalf("the cache %v is not the store %v", cache, got)
	}
}

// A subscriber resuming from a revision the store has compacted away
// lists again (no Interrupted: a relist is normal) and then follows.
func TestResumeBehindCompactionRelists(t *testing.T) {
	s := startStore(t, "--history-max-events", "5", "--compaction-interval", "100ms", "--watch-cache-events", "5")
	client := connect(t, s)
	w := &writer{t: t, client: client}
	w.create("edge")
	from := w.last()
	for i := 0; i < 20; i++ {
		w.update("edge", i+2)
	}
	w.create("tail")
	eventually(t, "the history before the resume point is compacted", func() bool {
		stream, err := client.WatchGateways(context.Background(), &gantryv1.WatchGatewaysRequest{ResourceVersion: from})
		if err != nil {
			return false
		}
		_, err = stream.Recv()
		return compacted(err)
	})

	r := &recorder{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ListThenWatch(ctx, client, WatchOptions{ResumeFrom: from}, r.handle) }()
	eventually(t, "the relist", func() bool { return r.seen(w.last()) })
	w.update("tail", 9)
	eventually(t, "the change after the relist", func() bool { return r.seen(w.last()) })
	cancel()
	<-done

	updates, cache := r.snapshot()
	var kinds []string
	for _, u := range updates {
		if u.Kind != Bookmark {
			kinds = append(kinds, u.Kind.String())
		}
	}
	if fmt.Sprint(kinds) != "[Init InitPage InitDone Applied]" {
		t.Fatalf("updates %v", kinds)
	}
	if got := stored(t, client); !equal(cache, got) {
		t.Fatalf("the cache %v is not the store %v", cache, got)
	}
}

// Errors retrying cannot fix end the loop with the store's error.
func TestPermanentErrorsEndTheLoop(t *testing.T) {
	s := startStore(t)
	client := connect(t, s)
	err := ListThenWatch(context.Background(), client, WatchOptions{LabelSelector: "in valid(("}, func(Update) error { return nil })
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("got %v", err)
	}
}

func TestBackoffDoublesToItsMaxWithJitter(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: 0.5}
	var delays []time.Duration
	for attempt := 0; attempt < 6; attempt++ {
		d := b.Delay(attempt)
		full := time.Duration(float64(b.Initial) * float64(int(1)<<attempt))
		if full > b.Max {
			full = b.Max
		}
		if d > full || d < full/2 {
			t.Fatalf("attempt %d: %v outside [%v, %v]", attempt, d, full/2, full)
		}
		delays = append(delays, d)
	}
	sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
	if delays[len(delays)-1] > b.Max {
		t.Fatal("over the max")
	}
}
