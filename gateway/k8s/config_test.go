package k8s

import (
	"errors"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  func(*Config) // applied to testConfig
		// keys are the keys the joined errors name, one error each, in
		// order ("discovery.kubernetes.<key>" starts each).
		keys []string
	}{
		{name: "valid"},
		{name: "kv ports clash", cfg: func(c *Config) { c.Port, c.KVEventsPort, c.KVReplayPort = "kv-events", "kv-events", "kv-events" }, keys: []string{"kv_events_port", "kv_replay_port"}},
		{name: "disabled zero config", cfg: func(c *Config) { *c = Config{} }},
		{name: "disabled is valid whatever it holds", cfg: func(c *Config) {
			*c = Config{Selector: "app in (", Service: "Not_A_Label", Namespaces: []string{"x", "x"}, Scheme: "ftp",
				Names: "node", Models: []string{"a"}, ModelsLabel: "b", MaxInFlight: -1, SyncTimeout: -1, Batch: -1}
		}},
		{name: "selector only", cfg: func(c *Config) { c.Service = ""; c.Selector = "app=vllm,tier!=cache" }},
		{name: "service and selector", cfg: func(c *Config) { c.Selector = "app=vllm" }},
		{name: "service or selector required", cfg: func(c *Config) { c.Service = "" }, keys: []string{"service"}},
		{name: "bad selector", cfg: func(c *Config) { c.Selector = "app in (" }, keys: []string{"selector"}},
		{name: "service not a DNS-1035 label", cfg: func(c *Config) { c.Service = "1vllm" }, keys: []string{"service"}},
		{name: "service with upper case", cfg: func(c *Config) { c.Service = "Vllm" }, keys: []string{"service"}},
		{name: "service not even a label value", cfg: func(c *Config) { c.Service = "a/b" }, keys: []string{"selector", "service"}},
		{name: "namespaces", cfg: func(c *Config) { c.Namespaces = []string{"team-a", "team-b"} }},
		{name: "bad namespace", cfg: func(c *Config) { c.Namespaces = []string{"team-a", "Team_B"} }, keys: []string{"namespaces"}},
		{name: "empty namespace", cfg: func(c *Config) { c.Namespaces = []string{""} }, keys: []string{"namespaces"}},
		{name: "duplicate namespace", cfg: func(c *Config) { c.Namespaces = []string{"team-a", "team-b", "team-a"} }, keys: []string{"namespaces"}},
		{name: "address_type IPv6", cfg: func(c *Config) { c.AddressType = AddressTypeIPv6 }},
		{name: "address_type FQDN", cfg: func(c *Config) { c.AddressType = AddressTypeFQDN }},
		{name: "address_type spelled otherwise", cfg: func(c *Config) { c.AddressType = "ipv4" }, keys: []string{"address_type"}},
		{name: "empty address_type", cfg: func(c *Config) { c.AddressType = "" }, keys: []string{"address_type"}},
		{name: "https", cfg: func(c *Config) { c.Scheme = "https" }},
		{name: "bad scheme", cfg: func(c *Config) { c.Scheme = "ftp" }, keys: []string{"scheme"}},
		{name: "empty scheme", cfg: func(c *Config) { c.Scheme = "" }, keys: []string{"scheme"}},
		{name: "names slice-address", cfg: func(c *Config) { c.Names = NamesSliceAddress }},
		{name: "names service-address", cfg: func(c *Config) { c.Names = NamesServiceAddress }},
		{name: "bad names", cfg: func(c *Config) { c.Names = "node" }, keys: []string{"names"}},
		{name: "empty names", cfg: func(c *Config) { c.Names = "" }, keys: []string{"names"}},
		{name: "models", cfg: func(c *Config) { c.Models = []string{"llama-3-8b"} }},
		{name: "models annotation", cfg: func(c *Config) { c.ModelsAnnotation = "switchboard.io/models" }},
		{name: "models label", cfg: func(c *Config) { c.ModelsLabel = "switchboard.io/model" }},
		{name: "models annotation without a prefix", cfg: func(c *Config) { c.ModelsAnnotation = "models" }},
		{name: "models annotation with two slashes", cfg: func(c *Config) { c.ModelsAnnotation = "switchboard.io/models/v1" }, keys: []string{"models_annotation"}},
		{name: "models annotation with a space", cfg: func(c *Config) { c.ModelsAnnotation = "switchboard models" }, keys: []string{"models_annotation"}},
		{name: "models annotation with a bad prefix", cfg: func(c *Config) { c.ModelsAnnotation = "Switchboard_IO/models" }, keys: []string{"models_annotation"}},
		{name: "models label too long", cfg: func(c *Config) { c.ModelsLabel = strings.Repeat("m", 64) }, keys: []string{"models_label"}},
		{name: "models label ending in a dash", cfg: func(c *Config) { c.ModelsLabel = "switchboard.io/model-" }, keys: []string{"models_label"}},
		{name: "models and annotation", cfg: func(c *Config) { c.Models = []string{"m"}; c.ModelsAnnotation = "a" }, keys: []string{"models"}},
		{name: "annotation and label", cfg: func(c *Config) { c.ModelsAnnotation = "a"; c.ModelsLabel = "l" }, keys: []string{"models"}},
		{name: "all three models sources", cfg: func(c *Config) { c.Models = []string{"m"}; c.ModelsAnnotation = "a"; c.ModelsLabel = "l" }, keys: []string{"models"}},
		{name: "empty model", cfg: func(c *Config) { c.Models = []string{"m", " "} }, keys: []string{"models"}},
		{name: "role label off", cfg: func(c *Config) { c.RoleLabel = "" }},
		{name: "role and group labels", cfg: func(c *Config) { c.RoleLabel = "example.com/role"; c.GroupLabel = "example.com/group" }},
		{name: "group label only", cfg: func(c *Config) { c.RoleLabel = ""; c.GroupLabel = "rack" }},
		{name: "bad role label", cfg: func(c *Config) { c.RoleLabel = "llm-d.ai/role/x" }, keys: []string{"role_label"}},
		{name: "bad group label", cfg: func(c *Config) { c.GroupLabel = "a b" }, keys: []string{"group_label"}},
		{name: "bad role and group labels", cfg: func(c *Config) { c.RoleLabel = "-r"; c.GroupLabel = "g-" }, keys: []string{"role_label", "group_label"}},
		{name: "role and group the same label", cfg: func(c *Config) { c.GroupLabel = DefaultRoleLabel }, keys: []string{"role_label"}},
		{name: "max_in_flight 0", cfg: func(c *Config) { c.MaxInFlight = 0 }},
		{name: "negative max_in_flight", cfg: func(c *Config) { c.MaxInFlight = -1 }, keys: []string{"max_in_flight"}},
		{name: "sync_timeout 0", cfg: func(c *Config) { c.SyncTimeout = 0 }, keys: []string{"sync_timeout"}},
		{name: "negative sync_timeout", cfg: func(c *Config) { c.SyncTimeout = -time.Second }, keys: []string{"sync_timeout"}},
		{name: "batch 0", cfg: func(c *Config) { c.Batch = 0 }},
		{name: "negative batch", cfg: func(c *Config) { c.Batch = -time.Millisecond }, keys: []string{"batch"}},
		{name: "every problem reported", cfg: func(c *Config) {
			c.Service, c.Scheme, c.MaxInFlight, c.Batch = "", "ftp", -1, -1
		}, keys: []string{"service", "scheme", "max_in_flight", "batch"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			err := cfg.Validate()
			if len(tt.keys) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate: nil, want errors on %q", tt.keys)
			}
			var errs []error
			if j, ok := err.(interface{ Unwrap() []error }); ok {
				errs = j.Unwrap()
			}
			if len(errs) != len(tt.keys) {
				t.Fatalf("Validate: %d errors, want %d (%q):\n%v", len(errs), len(tt.keys), tt.keys, err)
			}
			for i, e := range errs {
				prefix := "discovery.kubernetes." + tt.keys[i]
				if msg := e.Error(); !strings.HasPrefix(msg, prefix) || len(msg) == len(prefix) || !strings.ContainsAny(msg[len(prefix):len(prefix)+1], " :,") {
					t.Errorf("error %d %q does not name the key %s", i, msg, prefix)
				}
			}
		})
	}
}

func TestConfigValidateDefaults(t *testing.T) {
	c := DefaultConfig()
	if c.Enabled || c.AddressType != AddressTypeIPv4 || c.Scheme != "http" || c.Names != NamesPod || c.SyncTimeout != 30*time.Second ||
		c.Batch != 100*time.Millisecond || c.RoleLabel != "llm-d.ai/role" || c.GroupLabel != "" {
		t.Errorf("DefaultConfig() = %+v", c)
	}
	c.Enabled = true
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "discovery.kubernetes.service or selector") {
		t.Errorf("enabled defaults without service or selector: %v", err)
	}
	if errors.Is(c.Validate(), ErrForbidden) {
		t.Errorf("a config error is not ErrForbidden")
	}
}

func TestConfigSelector(t *testing.T) {
	svc := func(name string, more ...string) labels.Set {
		s := labels.Set{ServiceNameLabel: name}
		for i := 0; i+1 < len(more); i += 2 {
			s[more[i]] = more[i+1]
		}
		return s
	}
	tests := []struct {
		name              string
		service, selector string
		want              string // the selector's String
		match, noMatch    []labels.Set
	}{
		{
			name: "service", service: "vllm",
			want:    "kubernetes.io/service-name=vllm",
			match:   []labels.Set{svc("vllm"), svc("vllm", "app", "other")},
			noMatch: []labels.Set{svc("vllm-2"), {"app": "vllm"}, {}},
		},
		{
			name: "selector", selector: "app=vllm,tier!=cache",
			want:    "app=vllm,tier!=cache",
			match:   []labels.Set{{"app": "vllm"}, svc("other", "app", "vllm")},
			noMatch: []labels.Set{{"app": "vllm", "tier": "cache"}, svc("vllm"), {}},
		},
		{
			name: "service and selector: both must match", service: "vllm", selector: "app=vllm",
			want:    "app=vllm,kubernetes.io/service-name=vllm",
			match:   []labels.Set{svc("vllm", "app", "vllm")},
			noMatch: []labels.Set{svc("vllm"), {"app": "vllm"}, svc("other", "app", "vllm")},
		},
		{
			name: "set-based selector and service", service: "vllm", selector: "model in (llama,qwen)",
			want:    "kubernetes.io/service-name=vllm,model in (llama,qwen)",
			match:   []labels.Set{svc("vllm", "model", "qwen")},
			noMatch: []labels.Set{svc("vllm", "model", "mistral"), svc("vllm")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig()
			c.Service, c.Selector = tt.service, tt.selector
			sel, err := c.selector()
			if err != nil {
				t.Fatalf("selector: %v", err)
			}
			if got := sel.String(); got != tt.want {
				t.Errorf("selector %q, want %q", got, tt.want)
			}
			for _, l := range tt.match {
				if !sel.Matches(l) {
					t.Errorf("%q does not match %v", sel, l)
				}
			}
			for _, l := range tt.noMatch {
				if sel.Matches(l) {
					t.Errorf("%q matches %v", sel, l)
				}
			}
		})
	}
}
