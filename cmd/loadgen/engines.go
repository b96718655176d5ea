package main

// MaxEngineNames bounds the distinct engine names a report counts requests
// under. Responses naming further engines are counted under OtherEngines, so
// a server that sends a new name with every response cannot grow the report
// without bound.
const MaxEngineNames = 256

// OtherEngines is the engine name under which requests to engines beyond
// the first MaxEngineNames are counted.
const OtherEngines = "other"

// countEngines counts results by the engine their response named, keeping at
// most MaxEngineNames names (the first ones seen) and counting the rest under
// OtherEngines. Results whose response named no engine are not counted. It
// returns nil when no result named an engine.
func countEngines(results []*Result) map[string]int {
	var counts map[string]int
	named := 0
	for _, res := range results {
		if res.Engine == "" {
			continue
		}
		if counts == nil {
			counts = map[string]int{}
		}
		name := res.Engine
		if _, ok := counts[name]; !ok && name != OtherEngines {
			if named == MaxEngineNames {
				name = OtherEngines
			} else {
				named++
			}
		}
		counts[name]++
	}
	return counts
}

// busiestShare returns the largest per-engine count of counts over the mean
// count per engine: 1 is a perfectly even spread, 2 means the busiest engine
// took twice its fair share. The mean divides by the number of named engines
// or by engines, whichever is larger, so an engine known to exist (one of the
// --engine-metrics URLs) that got no request still counts. Requests counted
// under OtherEngines are left out. It returns 0 when counts holds no named
// engine.
func busiestShare(counts map[string]int, engines int) float64 {
	total, busiest, named := 0, 0, 0
	for name, n := range counts {
		if name == OtherEngines {
			continue
		}
		named++
		total += n
		busiest = max(busiest, n)
	}
	if total == 0 {
		return 0
	}
	return float64(busiest) * float64(max(named, engines)) / float64(total)
}
