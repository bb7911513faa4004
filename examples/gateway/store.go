package main

import (
	"context"
	"log/slog"

	"github.com/ratelimit-go/ratelimit"
	"github.com/ratelimit-go/ratelimit/examples/internal/backend"
	"github.com/ratelimit-go/ratelimit/examples/internal/envoyrules"
	"github.com/ratelimit-go/ratelimit/internal/concurrency"
)

// openStore opens the gateway's store (see backend.Open): the gateways beat under
// "gateway", and every algorithm a rule may name is loaded before serving.
func openStore(ctx context.Context, cfg backend.Config, m *metrics, log *slog.Logger) (ratelimit.Store, func(), error) {
	cfg.Members, cfg.Algorithms = "gateway", algorithmList()
	return backend.Open(ctx, cfg, m.store, log)
}

// algorithmList is every algorithm a rule may name, and the in-flight limit's.
func algorithmList() []*ratelimit.Algorithm {
	return append([]*ratelimit.Algorithm{concurrency.Algorithm()}, envoyrules.AlgorithmList()...)
}
