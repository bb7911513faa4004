package llmlimit

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/fixedwindow"
	"github.com/ratelimit-go/ratelimit/tokenbucket"
)

// The names of the policies Table.Policies makes, which the header writers know.
const (
	Requests       = "requests"         // requests a minute
	RequestsPerDay = "requests-per-day" // requests a day
	Tokens         = "tokens"           // tokens a minute, input and output weighed
	InputTokens    = "input-tokens"     // input tokens a minute
	OutputTokens   = "output-tokens"    // output tokens a minute
	TokensPerDay   = "tokens-per-day"   // tokens a day, input and output weighed
)

// DefaultMaxTokens is the completion estimated for a request that says no max_tokens,
// when Options.MaxTokens is 0.
const DefaultMaxTokens = 4096

const (
	tokensUnit        = "tokens"             // RateLimit-Policy's qu of the token limits
	defaultFamilyName = "the default models" // for errors
)

// Limits are one model's (or family of models') limits per API key, as the providers
// state them: 0 is no such limit. A minute's limits refill continuously (a token bucket
// of a minute's worth, as OpenAI's do), a day's are counted from midnight UTC. A key
// unused for a minute holds a minute's worth, so in its first minute it may be admitted
// twice a minute's limit: the whole at once, then the limit's rate. Where "60 a minute"
// must mean at most 60 in any minute, set Options.RequestsBurst.
type Limits struct {
	RequestsPerMinute     int64 `json:"requests_per_minute,omitempty"`
	RequestsPerDay        int64 `json:"requests_per_day,omitempty"`
	TokensPerMinute       int64 `json:"tokens_per_minute,omitempty"` // input and output, weighed (Weights)
	InputTokensPerMinute  int64 `json:"input_tokens_per_minute,omitempty"`
	OutputTokensPerMinute int64 `json:"output_tokens_per_minute,omitempty"`
	TokensPerDay          int64 `json:"tokens_per_day,omitempty"` // input and output, weighed (Weights)
}

// Table is each model's limits: by a model's name or the prefix of a family ("gpt-4o"
// for "gpt-4o-2024-08-06": the longest prefix in the table that the model's name starts
// with), and "" for every other model (or a request that names none; without it, such
// a request is not limited). Each API key has limits of its own for each entry: its
// requests to two models of one family share them, its requests to two families do not.
type Table map[string]Limits

// Weights are what an input and an output token count in TokensPerMinute and
// TokensPerDay (as Kong's AI rate limiting weighs them by price): 1 each when zero. A
// request costs input × Input + output × Output, rounded up.
type Weights struct {
	Input  float64 `json:"input,omitempty"`
	Output float64 `json:"output,omitempty"`
}

// Options tune the policies of a Table.
type Options struct {
	// Weights weigh input and output tokens in the total token limits.
	Weights Weights
	// MaxTokens is the completion estimated for a request that says no max_tokens:
	// DefaultMaxTokens when 0.
	MaxTokens int64
	// Key is the key a request is limited by, before its model's: APIKey when nil.
	Key func(r *http.Request) (string, error)
	// RequestsBurst is how many requests a key may make at once under RequestsPerMinute:
	// a minute's worth when 0 (or more than the limit). A key is then admitted at most
	// RequestsBurst beyond the limit in any minute: with 1, 61 for 60 a minute. The
	// token limits keep a minute's worth, so that one large request fits.
	RequestsBurst int64
}

// family is the entry of t a model's requests are limited by, and whether there is one.
func (t Table) family(model string) (string, bool) {
	best, found := "", false
	for name := range t {
		if strings.HasPrefix(model, name) && (!found || len(name) > len(best)) {
			best, found = name, true
		}
	}
	return best, found
}

// check says what is wrong with t: a limit below 0, weights below 0 or not finite.
func (t Table) check(o Options) error {
	var errs []error
	for name, l := range t {
		for _, v := range []int64{l.RequestsPerMinute, l.RequestsPerDay, l.TokensPerMinute, l.InputTokensPerMinute, l.OutputTokensPerMinute, l.TokensPerDay} {
			if v < 0 {
				errs = append(errs, fmt.Errorf("llmlimit: the limits of %s: %d is below 0", familyName(name), v))
				break
			}
		}
	}
	if o.RequestsBurst < 0 {
		errs = append(errs, fmt.Errorf("llmlimit: a RequestsBurst of %d is below 0", o.RequestsBurst))
	}
	for _, w := range []float64{o.Weights.Input, o.Weights.Output} {
		if w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
			errs = append(errs, fmt.Errorf("llmlimit: a weight of %v: weights are finite and not below 0", w))
		}
	}
	if o.MaxTokens < 0 {
		errs = append(errs, fmt.Errorf("llmlimit: Options.MaxTokens %d is below 0", o.MaxTokens))
	}
	return errors.Join(errs...)
}

func familyName(name string) string {
	if name == "" {
		return defaultFamilyName
	}
	return fmt.Sprintf("%q", name)
}

// LimitKey is the limiter key of an API key's limits for a family of models (a Table's
// entry, "" for the default): ratelimit.Key of the two, so that no API key and family
// make another pair's key.
func LimitKey(apiKey, family string) string { return ratelimit.Key(apiKey, family) }

// errNoGate refuses a request that did not pass a Gate: the policies cannot read it.
var errNoGate = errors.New("llmlimit: a request that did not pass a Gate: the limits cannot read it (put the Middleware inside Gate.Wrap)")

// limit is one kind of limit of a Table: its policy's name, its rule in a model's Limits
// (zero for none), and its cost (nil: a request).
type limit struct {
	name string
	rule func(Limits) ratelimit.Rule
	cost func(x *Exchange, u Usage, known bool) (estimate, actual int64)
}

// Policies are the Middleware's Policies of t's limits on store (every limit of a request
// decided together, all or none: see ratelimit.Middleware.Policies), each named as the
// header writers know it (Requests, Tokens, ...), for the requests through a Gate. A
// request is limited under its model's entry (see Table), with the key of its API key
// (Options.Key) and the entry's name (LimitKey). Each token limit admits it on an
// estimate, its prompt's tokens and its max_tokens for each completion it asks for (n;
// Options.MaxTokens when it says none; embeddings none), and is charged the usage its answer reports once it is served (the estimate
// stands for an answer that reports none): a debt when it used more, however much more
// (a prompt the estimate cannot read: tools, images, token arrays), a refund, as far as
// the key would still hold it, when less.
//
// A request that did not pass a Gate is refused (the Middleware's KeyError answers it),
// never let through unlimited. An error says what is wrong with t or o.
func (t Table) Policies(store ratelimit.Store, o Options) ([]ratelimit.Policy, error) {
	if err := t.check(o); err != nil {
		return nil, err
	}
	wIn, wOut := o.Weights.Input, o.Weights.Output
	if wIn == 0 {
		wIn = 1
	}
	if wOut == 0 {
		wOut = 1
	}
	keyOf := o.Key
	if keyOf == nil {
		keyOf = APIKey
	}
	maxTokens := o.MaxTokens
	if maxTokens == 0 {
		maxTokens = DefaultMaxTokens
	}
	out := func(x *Exchange) int64 {
		if x.Request.Embeddings {
			return 0
		}
		each := maxTokens
		if x.Request.MaxTokens > 0 {
			each = x.Request.MaxTokens
		}
		return ceil(float64(each) * float64(max(1, x.Request.Choices)))
	}
	weighed := func(in, out int64) int64 { return ceil(float64(in)*wIn + float64(out)*wOut) }
	total := func(x *Exchange, u Usage, known bool) (int64, int64) {
		return weighed(x.Request.Input, out(x)), weighed(u.Input, u.Output)
	}
	kinds := []limit{
		{Requests, func(l Limits) ratelimit.Rule {
			r := ratelimit.PerMinute(l.RequestsPerMinute)
			if o.RequestsBurst > 0 && o.RequestsBurst < r.Limit {
				r.Burst = o.RequestsBurst
			}
			return r
		}, nil},
		{RequestsPerDay, func(l Limits) ratelimit.Rule { return ratelimit.PerDay(l.RequestsPerDay) }, nil},
		{Tokens, func(l Limits) ratelimit.Rule { return ratelimit.PerMinute(l.TokensPerMinute) }, total},
		{InputTokens, func(l Limits) ratelimit.Rule { return ratelimit.PerMinute(l.InputTokensPerMinute) },
			func(x *Exchange, u Usage, _ bool) (int64, int64) { return x.Request.Input, u.Input }},
		{OutputTokens, func(l Limits) ratelimit.Rule { return ratelimit.PerMinute(l.OutputTokensPerMinute) },
			func(x *Exchange, u Usage, _ bool) (int64, int64) { return out(x), u.Output }},
		{TokensPerDay, func(l Limits) ratelimit.Rule { return ratelimit.PerDay(l.TokensPerDay) }, total},
	}
	names := make([]string, 0, len(t))
	for name := range t {
		names = append(names, name)
	}
	sort.Strings(names)
	var ps []ratelimit.Policy
	for _, k := range kinds {
		var first ratelimit.Rule // the limiter's own rule: each request's is its model's
		for _, name := range names {
			if r := k.rule(t[name]); r.Limit > 0 {
				first = r
				break
			}
		}
		if first.Limit == 0 {
			continue // no model has such a limit
		}
		var l *ratelimit.AlgorithmLimiter
		var err error
		if first.Period == 24*time.Hour {
			l, err = fixedwindow.New(store, first, ratelimit.WithNamespace(k.name))
		} else {
			l, err = tokenbucket.New(store, first, ratelimit.WithNamespace(k.name))
		}
		if err != nil {
			return nil, fmt.Errorf("llmlimit: the %s limit: %w", k.name, err)
		}
		p := ratelimit.Policy{
			Name:    k.name,
			Limiter: l,
			Match: func(r *http.Request) bool {
				x := ExchangeOf(r)
				if x == nil {
					return true // For refuses it
				}
				if x.read && k.cost != nil {
					return false // a read (the models) costs no tokens
				}
				f, ok := t.family(x.Request.Model)
				return ok && k.rule(t[f]).Limit > 0
			},
			For: func(r *http.Request) (ratelimit.PolicyLimit, error) {
				x := ExchangeOf(r)
				if x == nil {
					return ratelimit.PolicyLimit{}, errNoGate
				}
				f, _ := t.family(x.Request.Model)
				key, err := keyOf(r)
				if err != nil {
					return ratelimit.PolicyLimit{}, err
				}
				return ratelimit.PolicyLimit{Key: LimitKey(key, f), Rule: k.rule(t[f])}, nil
			},
		}
		if k.cost != nil {
			cost := k.cost
			p.Cost = &ratelimit.Cost{
				Unit: tokensUnit,
				Max:  math.MaxInt64, // every token the answer reports, however far past the estimate
				Estimate: func(r *http.Request) int64 {
					x := ExchangeOf(r)
					if x == nil {
						return 1
					}
					est, _ := cost(x, Usage{}, false)
					return est
				},
				Actual: func(r *http.Request, _ ratelimit.Answer) int64 {
					x := ExchangeOf(r)
					if x == nil {
						return -1
					}
					u, known := x.Usage()
					if !known {
						return -1
					}
					_, actual := cost(x, u, true)
					return actual
				},
			}
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// ceil is v rounded up, within int64.
func ceil(v float64) int64 {
	if v >= math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(math.Ceil(v))
}
