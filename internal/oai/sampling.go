package oai

import "encoding/json"

// SamplingRaw holds the raw JSON values of a generation request's sampling
// parameters as [Parser.Parse] found them (the last of duplicate keys),
// aliasing the body; nil for a parameter the request does not set.
type SamplingRaw struct {
	Temperature, TopP, TopK, FrequencyPenalty, PresencePenalty []byte
	Seed, N                                                    []byte
	// Stop is "stop" (a string or an array of strings, OpenAI and vLLM);
	// StopSequences Anthropic's "stop_sequences".
	Stop, StopSequences []byte
	// ResponseFormat is the "response_format" object.
	ResponseFormat []byte
}

// Sampling is a generation request's sampling parameters, for the GenAI
// span attributes gen_ai.request.* (OpenTelemetry GenAI conventions
// v1.41.1). A nil pointer or slice is a parameter the request does not set
// (or sets to null or to a value of the wrong type).
type Sampling struct {
	Temperature, TopP, TopK, FrequencyPenalty, PresencePenalty *float64
	Seed                                                       *int64
	// N is the choice count ("n").
	N *int64
	// Stop holds the stop sequences: "stop" as one string or an array of
	// strings, else "stop_sequences".
	Stop []string
	// OutputType is "json" for a response_format of type json_object or
	// json_schema, "text" for text; "" when not set.
	OutputType string
}

// ParseSampling decodes the raw values the parser kept. Only the few bytes
// of each parameter are decoded (a value of the wrong type is left out);
// it allocates, so call it only when the result is used, for a recorded
// span.
func ParseSampling(r SamplingRaw) Sampling {
	var s Sampling
	for _, f := range []struct {
		raw []byte
		dst **float64
	}{{r.Temperature, &s.Temperature}, {r.TopP, &s.TopP}, {r.TopK, &s.TopK}, {r.FrequencyPenalty, &s.FrequencyPenalty}, {r.PresencePenalty, &s.PresencePenalty}} {
		var v float64
		if f.raw != nil && json.Unmarshal(f.raw, &v) == nil && !nullOrAbsent(f.raw) {
			*f.dst = &v
		}
	}
	for _, f := range []struct {
		raw []byte
		dst **int64
	}{{r.Seed, &s.Seed}, {r.N, &s.N}} {
		var v int64
		if f.raw != nil && json.Unmarshal(f.raw, &v) == nil && !nullOrAbsent(f.raw) {
			*f.dst = &v
		}
	}
	var one string
	var many []string
	switch {
	case r.Stop != nil && json.Unmarshal(r.Stop, &one) == nil && one != "":
		s.Stop = []string{one}
	case r.Stop != nil && json.Unmarshal(r.Stop, &many) == nil && len(many) > 0:
		s.Stop = many
	case r.StopSequences != nil && json.Unmarshal(r.StopSequences, &many) == nil && len(many) > 0:
		s.Stop = many
	}
	var rf struct {
		Type string `json:"type"`
	}
	if r.ResponseFormat != nil && json.Unmarshal(r.ResponseFormat, &rf) == nil {
		switch rf.Type {
		case "json_object", "json_schema":
			s.OutputType = "json"
		case "text":
			s.OutputType = "text"
		}
	}
	return s
}
