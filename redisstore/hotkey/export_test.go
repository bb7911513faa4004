package hotkey

// Held is what p's leases of key hold now (under any rule): the events it may admit that
// the next store counted before.
func (p *Leases) Held(key string) int64 {
	var n int64
	p.table.each(func(l *lease) {
		if l.key == key && !l.ended.Load() {
			n += max(0, l.tokens.Load())
		}
	})
	return n
}
