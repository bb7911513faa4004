package fallback

import (
	"context"
	"time"
)

// logError logs an error of the primary that opens nothing, at most once a second.
func (s *Store) logError(ctx context.Context, err error) {
	now := s.clock.Now().UnixNano()
	if last := s.lastLogged.Load(); now-last >= int64(time.Second) && s.lastLogged.CompareAndSwap(last, now) {
		s.log.WarnContext(ctx, "fallback: the primary failed; decided on the secondary", "err", err)
	}
}

// reopenLogEvery is how often, at most, the log says that the breaker's probes still
// fail.
const reopenLogEvery = 30 * time.Second

// logChange logs a change of the breaker's state: each opening and closing, and a probe
// that failed (half-open to open) at most every reopenLogEvery, with the probe's error and
// how many failed since the last line.
func (s *Store) logChange(from, to BreakerState) {
	var err error
	if p := s.lastErr.Load(); p != nil {
		err = *p
	}
	switch {
	case to == Open && from == HalfOpen:
		failed := s.failedProbes.Add(1)
		now := s.clock.Now().UnixNano()
		if last := s.lastReopenLog.Load(); last != 0 && now-last < int64(reopenLogEvery) || !s.lastReopenLog.CompareAndSwap(last, now) {
			return
		}
		s.failedProbes.Add(-failed)
		s.log.Warn("fallback: the primary still fails; deciding on the secondary", "err", err,
			"failed_probes", failed, "instances", s.n(), "next_probe_in", s.breaker.openFor.String())
	case to == Open:
		s.log.Warn("fallback: the breaker opened; deciding on the secondary", "from", from.String(), "err", err,
			"instances", s.n(), "for", s.breaker.openFor.String())
	case to == Closed:
		s.lastReopenLog.Store(0)
		s.log.Info("fallback: the breaker closed; the primary decides again", "from", from.String())
	}
}
