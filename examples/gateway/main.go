// Gateway is an API gateway that rate-limits every request per (tenant, route) before it
// reaches the service behind it: the reference use of this library as net/http middleware.
//
//	go run ./examples/gateway
//
// starts it on :8080 in front of a built-in demo service, with an embedded miniredis, so
// that the whole Redis path (Lua scripts, keys, TTLs) runs with nothing to install. Then:
//
//	curl -i -H 'X-Api-Key: shop-a' -X POST localhost:8080/orders
//
// The tenant is the X-Api-Key header (a request without it gets 401); the route comes
// from the route table of the rules; each (tenant, route) gets its rule, or the default.
// Every response carries X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset,
// and the IETF draft's RateLimit-Policy and RateLimit; a denied request gets 429 with
// Retry-After. A rule may also bound the requests of its (tenant, route) in progress at
// once (in_flight): each such request holds a lease in Redis while the upstream serves
// it (extended while it runs, expiring -lease after a gateway that died), and one too
// many gets 429. Decisions go to Redis through a fail-open store: while Redis is down
// each of the gateways enforces its share of every rule in memory, and the log says when
// it switches and why. How many gateways share: by default the number alive, which each
// learns while Redis is up (every gateway beats in Redis every 2s; see
// members.Members); -instances N fixes it.
//
// A misconfiguration stops it at start, with a message: -redis and -redis-cluster
// together, -redis-cluster at a server without cluster support, -redis at a cluster node,
// a -rules-dsn that is not postgres://, cannot be reached, or has no rate_limit_rule
// table. A Redis that does not answer at start does not: the gateway starts on the shares.
//
// With -region and -regions, every limit is split between regions that each decide on a
// Redis of their own (see regions.Regions): each region's gateways enforce its share
// of every rule, and the shares move toward the regions' traffic every -rebalance.
//
// With -envoy-rules, the limits come instead from rules in the format of Envoy's rate
// limit service (see examples/rls): a request's descriptors are its api_key (the
// tenant), route, path and method, as the file's descriptor tree names them, decided
// all or none.
//
// Rules come from -rules (a YAML file, reloaded when it changes and every -reload; the
// embedded rules.yaml by default) and, with -rules-dsn, from the PostgreSQL table of
// schema.sql (read every -reload, and at once on NOTIFY).
//
// Every path of -addr goes to the upstream (a request's path cleaned first, see
// canonicalPath); the gateway's own /metrics (Prometheus), /denied (the keys denied
// most over the last minute, in JSON) and /healthz are on -admin-addr (127.0.0.1:9090 by default: not public unless asked). Connections that
// stay idle past -idle-timeout are closed, and a request's reading and its answer's
// writing are bounded by -read-timeout and -write-timeout, as a proxy's are: a
// thousand idle keep-alive connections would otherwise each hold a goroutine and a file
// descriptor for ever.
package main

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
	_ "time/tzdata" // the quotas' time zones, on a machine without a zone database

	"github.com/redis/go-redis/v9"

	"github.com/ratelimit-go/ratelimit/examples/internal/backend"
)

//go:embed rules.yaml
var defaultRules []byte

type config struct {
	reserves                      string // -reserves, as given
	addr, adminAddr               string
	listening                     func(addrs []string) // the addresses bound, the request's first (for tests on ":0")
	idle, read, write             time.Duration        // the request server's timeouts; 0: the defaults
	upstream, rulesFile, rulesDSN string
	envoyRules                    string
	reload                        time.Duration
	trustedProxies                string
	lease                         time.Duration
	regions                       regionsConfig
	store                         backend.Config
}

func main() {
	var c config
	flag.StringVar(&c.addr, "addr", ":8080", "address to listen on")
	flag.StringVar(&c.adminAddr, "admin-addr", "127.0.0.1:9090", "address of /metrics, /denied and /healthz (empty: none)")
	flag.DurationVar(&c.idle, "idle-timeout", defaultIdleTimeout, "how long an idle keep-alive connection stays open")
	flag.DurationVar(&c.read, "read-timeout", defaultReadTimeout, "the most a request may take to arrive, its body included")
	flag.DurationVar(&c.write, "write-timeout", defaultWriteTimeout, "the most an answer may take, from the end of its request's headers")
	flag.StringVar(&c.upstream, "upstream", "", "URL of the service behind the gateway (default: a built-in demo service)")
	flag.StringVar(&c.rulesFile, "rules", "", "YAML rules file, reloaded when it changes (default: the embedded rules.yaml)")
	flag.StringVar(&c.envoyRules, "envoy-rules", "", "rules in the format of Envoy's rate limit service (a file, or a directory, one domain), reloaded when they change; the request's descriptors are its api_key, route, path and method")
	flag.StringVar(&c.rulesDSN, "rules-dsn", "", "PostgreSQL URL of the rate_limit_rule table (postgres://...)")
	flag.DurationVar(&c.reload, "reload", 30*time.Second, "how often to read the rules again")
	c.store.Flags(flag.CommandLine)
	flag.StringVar(&c.regions.self, "region", "", "this gateway's region, one of -regions: every limit is split between the regions by their traffic")
	flag.StringVar(&c.regions.list, "regions", "", "the regions and their Redis: eu=redis://host:6379,us=redis://host:6380 (with -region)")
	flag.DurationVar(&c.regions.every, "rebalance", 5*time.Minute, "how often the regions' shares move toward their traffic (with -region)")
	flag.DurationVar(&c.lease, "lease", defaultLease, "how long a request's in-flight lease lives unless extended: a gateway that dies gives its leases back after it (0: 30s)")
	flag.StringVar(&c.reserves, "reserves", "", "priority load shedding: the percent of each limit kept back from critical, normal and sheddable requests, for the more important (0,20,50, say; empty: none); a route's priority chooses the class, and X-Priority may lower it")
	flag.StringVar(&c.trustedProxies, "trusted-proxies", "", "CIDRs of proxies in front of the gateway; set, limits are also per client IP (from X-Forwarded-For past these proxies)")
	flag.Parse()
	c.store.LocalMaxKeys, c.store.LocalMaxBytes = 1<<20, 64<<20

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	redis.SetLogger(redisLog{log}) // go-redis's own lines, as JSON too
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, c, log); err != nil {
		log.Error("gateway stopped", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config, log *slog.Logger) error {
	rules, err := loadRules(c.rulesFile)
	if err != nil {
		return err
	}
	manager := newRuleManager(rules, log)
	if c.rulesDSN != "" { // read once before serving: a database that cannot serve rules is a misconfiguration
		if u, err := url.Parse(c.rulesDSN); err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
			return fmt.Errorf("-rules-dsn: want a postgres:// URL, not %q", c.rulesDSN)
		}
		rows, err := readRules(ctx, c.rulesDSN)
		if err != nil {
			return fmt.Errorf("-rules-dsn: cannot read the rate_limit_rule table: %w", err)
		}
		if !manager.setRows(rows) {
			return errors.New("-rules-dsn: the table's rules do not fit the rules file (see the log)")
		}
	}
	if c.rulesFile != "" {
		go watchFile(ctx, c.rulesFile, time.Second, c.reload, manager)
	}
	if c.rulesDSN != "" {
		go watchPostgres(ctx, c.rulesDSN, c.reload, manager)
	}

	var regionURLs map[string]string
	if c.regions.self != "" || c.regions.list != "" {
		if c.regions.self == "" || c.regions.list == "" {
			return errors.New("-region and -regions go together")
		}
		if c.store.RedisURL != "" || c.store.Cluster != "" {
			return errors.New("-region decides on its own region's Redis, from -regions: leave -redis and -redis-cluster out")
		}
		if regionURLs, err = parseRegions(c.regions.list); err != nil {
			return err
		}
		if c.store.RedisURL = regionURLs[c.regions.self]; c.store.RedisURL == "" {
			return fmt.Errorf("-region %q is not one of -regions (%s)", c.regions.self, regionNames(regionURLs))
		}
	}
	m := newMetrics()
	store, closeStore, err := openStore(ctx, c.store, m, log)
	if err != nil {
		return err
	}
	defer closeStore()
	if regionURLs != nil {
		regions, closeRegions, err := openRegions(c.regions, regionURLs)
		if err != nil {
			return err
		}
		defer closeRegions()
		store = regions.Store(store)
		go regions.Run(ctx)
		go watchWeight(ctx, regions, c.regions.self, m.registry, log)
		log.Info("splitting every limit between regions by their traffic", "region", c.regions.self,
			"regions", regionNames(regionURLs), "rebalance", c.regions.every.String())
	}

	if c.upstream == "" {
		addr, stopDemo, err := demoUpstream()
		if err != nil {
			return err
		}
		defer stopDemo()
		c.upstream = addr
	}
	target, err := url.Parse(c.upstream)
	if err != nil || target.Host == "" {
		return fmt.Errorf("-upstream %q: not a URL", c.upstream)
	}
	reserves, err := parseReserves(c.reserves)
	if err != nil {
		return fmt.Errorf("-reserves: %w", err)
	}
	inflight, err := newInFlight(store, cmp.Or(c.lease, defaultLease), reserves)
	if err != nil {
		return fmt.Errorf("-lease or -reserves: %w", err)
	}
	lim := &limit{next: httputil.NewSingleHostReverseProxy(target), store: store, rules: &manager.current, metrics: m,
		log: log, inflight: inflight, reserves: reserves}
	if c.envoyRules != "" {
		if lim.envoy, err = newEnvoyRules(c.envoyRules, store); err != nil {
			return fmt.Errorf("-envoy-rules: %w", err)
		}
		go lim.envoy.watch(ctx, c.envoyRules, log)
	}
	if c.trustedProxies != "" {
		trusted, err := parsePrefixes(c.trustedProxies)
		if err != nil {
			return err
		}
		lim.trusted = trusted
	}

	read := cmp.Or(c.read, defaultReadTimeout)
	srv := &http.Server{Addr: c.addr, Handler: lim, ReadHeaderTimeout: min(10*time.Second, read),
		ReadTimeout: read, WriteTimeout: cmp.Or(c.write, defaultWriteTimeout),
		IdleTimeout: cmp.Or(c.idle, defaultIdleTimeout), MaxHeaderBytes: 64 << 10}
	servers := []*http.Server{srv}
	if c.adminAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", m.handler())
		mux.Handle("/denied", m.deniedHandler())
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
		servers = append(servers, &http.Server{Addr: c.adminAddr, Handler: mux, ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute})
	}
	// both addresses bound before either serves: an address taken is an error at start
	listeners := make([]net.Listener, len(servers))
	for i, s := range servers {
		l, err := net.Listen("tcp", s.Addr)
		if err != nil {
			for _, l := range listeners[:i] {
				l.Close()
			}
			return err
		}
		listeners[i] = l
	}
	errc := make(chan error, len(servers))
	for i, s := range servers {
		go func() { errc <- s.Serve(listeners[i]) }()
	}
	addrs := make([]string, len(listeners))
	for i, l := range listeners {
		addrs[i] = l.Addr().String()
	}
	if c.listening != nil {
		c.listening(addrs)
	}
	log.Info("gateway listening", "addr", addrs[0], "admin", c.adminAddr, "upstream", c.upstream, "instances", c.store.Instances)

	var failed error
	select {
	case failed = <-errc:
	case <-ctx.Done():
	}
	log.Info("shutting down")
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range servers {
		if err := s.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) && failed == nil {
			failed = err
		}
	}
	return failed
}

// The request server's timeouts, unless flags say otherwise: an idle keep-alive
// connection is closed after defaultIdleTimeout; a request must arrive, its body
// included, within defaultReadTimeout, and its answer be written within
// defaultWriteTimeout of its headers (an upstream that streams for longer needs more).
const (
	defaultIdleTimeout  = 30 * time.Second
	defaultReadTimeout  = 30 * time.Second
	defaultWriteTimeout = 60 * time.Second
)

// redisLog sends go-redis's log lines to the gateway's log.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, strings.TrimSpace(fmt.Sprintf(format, v...)), "source", "go-redis")
}

func loadRules(path string) (*Rules, error) {
	data := defaultRules
	if path != "" {
		var err error
		if data, err = os.ReadFile(path); err != nil {
			return nil, err
		}
	}
	return parseRules(data)
}

func parsePrefixes(s string) ([]netip.Prefix, error) {
	var prefixes []netip.Prefix
	for _, part := range strings.Split(s, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("-trusted-proxies: %w", err)
		}
		prefixes = append(prefixes, p.Masked())
	}
	return prefixes, nil
}
