package follow

// Remembered reports how many scopes f keeps in memory: those whose lease
// it knows held, and those whose mark waits to be recorded.
func (f *Follower) Remembered() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.open)
	for _, set := range []map[string]mark{f.pending, f.inflight} {
		for s := range set {
			if _, ok := f.open[s]; !ok {
				n++
			}
		}
	}
	return n
}
