package oai

import "encoding/json"

// Sampling is a generation request's sampling parameters, for the GenAI
// span attributes gen_ai.request.* (OpenTelemetry GenAI conventions
// v1.41.1). A nil pointer or slice is a parameter the request does not set.
type Sampling struct {
	Temperature      *float64 `json:"temperature"`
	TopP             *float64 `json:"top_p"`
	TopK             *float64 `json:"top_k"`
	FrequencyPenalty *float64 `json:"frequency_penalty"`
	PresencePenalty  *float64 `json:"presence_penalty"`
	Seed             *int64   `json:"seed"`
	// N is the choice count ("n").
	N *int64 `json:"n"`
	// Stop holds the stop sequences: "stop" as a string or an array of
	// strings (OpenAI, vLLM), or Anthropic's "stop_sequences".
	Stop []string `json:"-"`
	// OutputType is "json" for a response_format of json_object or
	// json_schema, "text" for text; "" when not set.
	OutputType string `json:"-"`
}

// ParseSampling reads the sampling parameters of a JSON request body. It
// decodes the whole body with encoding/json (and allocates): call it only
// when the result is used, for a recorded span. Fields of the wrong type
// are ignored; a body that is not a JSON object gives the zero Sampling.
func ParseSampling(body []byte) Sampling {
	var raw struct {
		Sampling
		Stop           json.RawMessage `json:"stop"`
		StopSequences  []string        `json:"stop_sequences"`
		ResponseFormat *struct {
			Type string `json:"type"`
		} `json:"response_format"`
	}
	if json.Unmarshal(body, &raw) != nil {
		// One bad field must not lose the others: decode them one by one.
		var fields map[string]json.RawMessage
		if json.Unmarshal(body, &fields) != nil {
			return Sampling{}
		}
		raw.Sampling = Sampling{} // drop what the failed decode half set
		for k, v := range fields {
			one, _ := json.Marshal(map[string]json.RawMessage{k: v})
			var part struct {
				Sampling
			}
			if json.Unmarshal(one, &part) == nil {
				mergeSampling(&raw.Sampling, part.Sampling)
			}
		}
		raw.Stop, raw.StopSequences, raw.ResponseFormat = fields["stop"], nil, nil
		if v, ok := fields["stop_sequences"]; ok {
			_ = json.Unmarshal(v, &raw.StopSequences)
		}
		if v, ok := fields["response_format"]; ok {
			_ = json.Unmarshal(v, &raw.ResponseFormat)
		}
	}
	s := raw.Sampling
	var one string
	var many []string
	switch {
	case json.Unmarshal(raw.Stop, &one) == nil && one != "":
		s.Stop = []string{one}
	case json.Unmarshal(raw.Stop, &many) == nil && len(many) > 0:
		s.Stop = many
	}
	if len(s.Stop) == 0 && len(raw.StopSequences) > 0 {
		s.Stop = raw.StopSequences
	}
	if raw.ResponseFormat != nil {
		switch raw.ResponseFormat.Type {
		case "json_object", "json_schema":
			s.OutputType = "json"
		case "text":
			s.OutputType = "text"
		}
	}
	return s
}

// mergeSampling sets in dst the parameters src sets.
func mergeSampling(dst *Sampling, src Sampling) {
	for _, p := range []struct{ d, s **float64 }{{&dst.Temperature, &src.Temperature}, {&dst.TopP, &src.TopP}, {&dst.TopK, &src.TopK}, {&dst.FrequencyPenalty, &src.FrequencyPenalty}, {&dst.PresencePenalty, &src.PresencePenalty}} {
		if *p.s != nil {
			*p.d = *p.s
		}
	}
	if src.Seed != nil {
		dst.Seed = src.Seed
	}
	if src.N != nil {
		dst.N = src.N
	}
}
