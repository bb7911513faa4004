package hotkey

// Held is what p's leases of key hold now (under any rule): the events it may admit that
// the next store counted before.
func (p *Leases) Held(key string) int64 {
	var n int64
	p.leased.each(func(e *entry) {
		if e.key == key && !e.ended.Load() {
			n += max(0, e.tokens.Load())
		}
	})
	return n
}
