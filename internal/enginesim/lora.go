package enginesim

import (
	"fmt"
	"net/http"
)

// maxLoRAs bounds the adapters loaded at once, so a client cannot grow the engine without
// limit (vLLM bounds its CPU adapter cache with --max-cpu-loras).
const maxLoRAs = 1024

// lora is one loaded adapter. Read-only once loaded.
type lora struct {
	base *modelState
	card modelCard // card.ID is the adapter's name, card.Root its path
}

// loraRequest is the body of POST /v1/load_lora_adapter and /v1/unload_lora_adapter.
type loraRequest struct {
	LoRAName    string `json:"lora_name"`
	LoRAPath    string `json:"lora_path"`
	LoadInplace bool   `json:"load_inplace"`
}

// addLoRA loads (or, with the same name, replaces) the adapter name from path on base. The
// caller holds no lock.
func (e *Engine) addLoRA(name, path string, base *modelState) {
	created := e.now().Unix()
	parent := base.name
	l := &lora{base: base, card: modelCard{
		ID: name, Object: "model", Created: created, OwnedBy: "vllm", Root: path, Parent: &parent,
		Permission: []modelPermission{newPermission(created)},
	}}
	e.loraMu.Lock()
	defer e.loraMu.Unlock()
	if old, ok := e.loras[name]; ok {
		for i, o := range e.loraOf {
			if o == old {
				e.loraOf[i] = l
			}
		}
	} else {
		e.loraOf = append(e.loraOf, l)
	}
	e.loras[name] = l
}

// serveLoadLoRA serves POST /v1/load_lora_adapter {lora_name, lora_path, load_inplace}: 200
// with vLLM's plain-text success message; 400 InvalidUserInput when a field is missing, the
// adapter is already loaded (without load_inplace) or names a served model. The adapter
// runs on the first served model.
func (e *Engine) serveLoadLoRA(w http.ResponseWriter, r *http.Request) {
	f, ok := e.beginLight(apiOpenAI, w, r)
	if !ok {
		return
	}
	var req loraRequest
	if !decodeBody(apiOpenAI, w, r, &req) {
		return
	}
	invalid := func(msg string) { apiOpenAI.writeTypedError(w, http.StatusBadRequest, "InvalidUserInput", msg) }
	if req.LoRAName == "" || req.LoRAPath == "" {
		invalid("Both 'lora_name' and 'lora_path' must be provided.")
		return
	}
	if _, ok := e.models[req.LoRAName]; ok {
		invalid(fmt.Sprintf("The lora adapter '%s' has the name of a served model.", req.LoRAName))
		return
	}
	e.loraMu.RLock()
	_, loaded := e.loras[req.LoRAName]
	count := len(e.loras)
	e.loraMu.RUnlock()
	if loaded && !req.LoadInplace {
		invalid(fmt.Sprintf("The lora adapter '%s' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True.", req.LoRAName))
		return
	}
	if !loaded && count >= maxLoRAs {
		invalid(fmt.Sprintf("At most %d lora adapters can be loaded.", maxLoRAs))
		return
	}
	c := e.newLightCall(w, r, f, apiOpenAI)
	_ = c.light("text/plain; charset=utf-8", func() ([]byte, error) {
		e.addLoRA(req.LoRAName, req.LoRAPath, e.models[e.cfg.Models[0]])
		return []byte(fmt.Sprintf("Success: LoRA adapter '%s' added successfully.", req.LoRAName)), nil
	})
}

// serveUnloadLoRA serves POST /v1/unload_lora_adapter {lora_name}: 200 with vLLM's
// plain-text success message; 400 InvalidUserInput without lora_name; 404 NotFoundError
// for an adapter that is not loaded.
func (e *Engine) serveUnloadLoRA(w http.ResponseWriter, r *http.Request) {
	f, ok := e.beginLight(apiOpenAI, w, r)
	if !ok {
		return
	}
	var req loraRequest
	if !decodeBody(apiOpenAI, w, r, &req) {
		return
	}
	if req.LoRAName == "" {
		apiOpenAI.writeTypedError(w, http.StatusBadRequest, "InvalidUserInput", "'lora_name' needs to be provided to unload a LoRA adapter.")
		return
	}
	e.loraMu.RLock()
	_, loaded := e.loras[req.LoRAName]
	e.loraMu.RUnlock()
	if !loaded {
		apiOpenAI.writeError(w, http.StatusNotFound, fmt.Sprintf("The lora adapter '%s' cannot be found.", req.LoRAName))
		return
	}
	c := e.newLightCall(w, r, f, apiOpenAI)
	_ = c.light("text/plain; charset=utf-8", func() ([]byte, error) {
		e.removeLoRA(req.LoRAName)
		return []byte(fmt.Sprintf("Success: LoRA adapter '%s' removed successfully.", req.LoRAName)), nil
	})
}

// removeLoRA unloads the adapter name if it is loaded. Requests already running on it
// finish normally; new ones get 404.
func (e *Engine) removeLoRA(name string) {
	e.loraMu.Lock()
	defer e.loraMu.Unlock()
	l, ok := e.loras[name]
	if !ok {
		return
	}
	delete(e.loras, name)
	for i, o := range e.loraOf {
		if o == l {
			e.loraOf = append(e.loraOf[:i], e.loraOf[i+1:]...)
			break
		}
	}
}
