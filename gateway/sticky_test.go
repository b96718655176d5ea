package gateway

import (
	"strconv"
	"testing"
)

// TestStickyIndexBounded fills the index past its capacity: it keeps the
// newest ids only, forgets the oldest first, and holds nothing before the
// first id.
func TestStickyIndexBounded(t *testing.T) {
	x := newStickyIndex(4)
	if cap(x.ring) != 0 || len(x.m) != 0 {
		t.Fatalf("an empty index holds %d ring slots, %d entries", cap(x.ring), len(x.m))
	}
	for i := range 10 {
		x.put("resp_"+strconv.Itoa(i), "e"+strconv.Itoa(i%2))
	}
	if len(x.m) != 4 || len(x.ring) != 4 {
		t.Fatalf("holds %d entries, %d ring slots, want 4", len(x.m), len(x.ring))
	}
	for i := range 10 {
		e, ok := x.get("resp_" + strconv.Itoa(i))
		if want := i >= 6; ok != want || ok && e != "e"+strconv.Itoa(i%2) {
			t.Errorf("resp_%d: %q %v, want present=%v", i, e, ok, want)
		}
	}
	x.put("resp_9", "e7") // an update does not evict
	if e, _ := x.get("resp_6"); e != "e0" {
		t.Errorf("resp_6 evicted by an update")
	}
	if e, _ := x.get("resp_9"); e != "e7" {
		t.Errorf("resp_9 = %q after update", e)
	}
}
