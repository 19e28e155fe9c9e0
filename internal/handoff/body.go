package handoff

import (
	"bytes"
	"strconv"

	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tandem-epp/tandem/internal/apierror"
	"github.com/tandem-epp/tandem/internal/request"
	"github.com/tandem-epp/tandem/internal/wire"
)

// Top-level keys the prefill leg of every engine overrides or removes.
var prefillKeys = []string{wire.FieldMaxTokens, wire.FieldMaxCompletionTokens, wire.FieldStream, wire.FieldStreamOptions, wire.FieldMinTokens,
	wire.FieldMaxOutputTokens, wire.FieldStore, wire.FieldBackground}

// checkControlled refuses a body Tandem cannot rewrite safely: not a JSON object, or naming one of
// the keys Tandem sets more than once at the top level. Engines read the last duplicate, so the
// value Tandem writes into the first one could be silently undone; the seed refuses this for
// SGLang and Tandem does for every engine, because all adapters edit keys in place.
func checkControlled(body []byte, keys []string) *apierror.Error {
	if request.TooDeep(body, request.MaxJSONDepth) { // before gjson, whose recursion would overflow the stack
		return apierror.BadRequest("bad_body", "", "request body nests arrays or objects more than %d levels deep; flatten it", request.MaxJSONDepth)
	}
	if !gjson.ValidBytes(body) {
		return apierror.BadRequest("bad_body", "", "request body is not valid JSON")
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return apierror.BadRequest("bad_body", "", "request body must be a JSON object")
	}
	seen := make(map[string]bool, len(keys))
	var dup string
	root.ForEach(func(k, _ gjson.Result) bool {
		for _, c := range keys {
			if k.Str != c {
				continue
			}
			if seen[c] {
				dup = c
				return false
			}
			seen[c] = true
		}
		return true
	})
	if dup != "" {
		return apierror.BadRequest("duplicate_key", dup,
			"the body names %q more than once; send it once (the prefill/decode hand-off sets this key)", dup)
	}
	return nil
}

// edit applies top-level edits to a JSON object, leaving every other byte as it was. Keys Tandem
// edits are plain identifiers, so they are valid sjson paths as they stand.
type edit struct {
	body []byte
	err  error
}

func newEdit(body []byte) *edit {
	// sjson may reuse its input's backing array; copy so the caller's body never changes.
	return &edit{body: bytes.Clone(body)}
}

func (e *edit) raw(key string, raw []byte) *edit {
	if e.err == nil {
		e.body, e.err = sjson.SetRawBytes(e.body, key, raw)
	}
	return e
}

func (e *edit) str(key, value string) *edit {
	if e.err == nil {
		e.body, e.err = sjson.SetBytes(e.body, key, value)
	}
	return e
}

func (e *edit) int(key string, value int64) *edit {
	return e.raw(key, strconv.AppendInt(nil, value, 10))
}

func (e *edit) del(key string) *edit {
	if e.err == nil {
		e.body, e.err = sjson.DeleteBytes(e.body, key)
	}
	return e
}

func (e *edit) done() ([]byte, error) { return e.body, e.err }

// prefillOnly turns a body into a one-token, non-streaming prefill leg. TensorRT-LLM's context
// leg deletes max_completion_tokens instead of setting it.
func (e *edit) prefillOnly(keepMaxCompletionTokens bool) *edit {
	e.raw(wire.FieldMaxTokens, []byte("1"))
	if keepMaxCompletionTokens {
		e.raw(wire.FieldMaxCompletionTokens, []byte("1"))
	} else {
		e.del(wire.FieldMaxCompletionTokens)
	}
	return e.raw(wire.FieldStream, []byte("false")).del(wire.FieldStreamOptions).del(wire.FieldMinTokens)
}

// firstObject returns the first path of the JSON document that holds an object.
func firstObject(doc []byte, paths ...string) (gjson.Result, bool) {
	for _, p := range paths {
		if r := gjson.GetBytes(doc, p); r.IsObject() {
			return r, true
		}
	}
	return gjson.Result{}, false
}
