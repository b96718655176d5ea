package oai

import (
	"reflect"
	"testing"
)

func TestParseSampling(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	i := func(v int64) *int64 { return &v }
	tests := []struct {
		name, body string
		want       Sampling
	}{
		{"none", `{"user":"u"}`, Sampling{}},
		{"all", `{"temperature":0.7,"top_p":0.9,"top_k":40,"frequency_penalty":0.1,"presence_penalty":-0.5,"seed":42,"n":2,"stop":["a","b"],"response_format":{"type":"json_schema"}}`,
			Sampling{Temperature: f(0.7), TopP: f(0.9), TopK: f(40), FrequencyPenalty: f(0.1), PresencePenalty: f(-0.5), Seed: i(42), N: i(2), Stop: []string{"a", "b"}, OutputType: "json"}},
		{"stop string", `{"stop":"END"}`, Sampling{Stop: []string{"END"}}},
		{"anthropic stop_sequences", `{"stop_sequences":["\n\nHuman:"],"temperature":1}`, Sampling{Stop: []string{"\n\nHuman:"}, Temperature: f(1)}},
		{"one bad field keeps the rest", `{"temperature":"hot","seed":7,"stop":5}`, Sampling{Seed: i(7)}},
		{"nulls", `{"temperature":null,"seed":null,"stop":null}`, Sampling{}},
		{"text format", `{"response_format":{"type":"text"}}`, Sampling{OutputType: "text"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseRequest(SchemaChat, []byte(`{"model":"m","messages":[{"role":"user","content":"x"}],`+tt.body[1:]))
			if err != nil {
				t.Fatal(err)
			}
			if got := ParseSampling(r.Sampling); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseSampling(%s) = %+v, want %+v", tt.body, got, tt.want)
			}
		})
	}
}
