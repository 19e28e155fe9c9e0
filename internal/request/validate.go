package request

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/apierror"
)

// The rules below are those of vLLM's OpenAI server (its pydantic models, in pydantic's
// default lax mode) for the fields Tandem reads. Tandem refuses what they refuse, with a 400
// naming the field, and reads what they accept the way they read it. Where vLLM's acceptance
// depends on a later stage (a chat template, the tokenizer), Tandem lets the request through:
// the engine decides, as it would without Tandem.

// readFields are the top-level fields Tandem reads, per API; a duplicate of one is refused.
// Engines (Python's json) keep the last duplicate while Tandem's reader sees the first, so the
// gateway would route by a value the engine never uses.
func readFields(api API) []string {
	switch api {
	case APIMessages:
		return messagesFields
	case APIResponses:
		return responsesFields
	}
	return openAIFields
}

var (
	openAIFields    = []string{"model", "messages", "prompt", "stream", "max_tokens", "max_completion_tokens"}
	messagesFields  = []string{"model", "messages", "system", "stream", "max_tokens"}
	responsesFields = []string{"model", "input", "instructions", "stream", "max_output_tokens"}
)

func noDuplicates(members []member, api API) error {
	fields := readFields(api)
	var seen [6]bool // one per field
	for _, m := range members {
		for i, f := range fields {
			if !m.is(f) {
				continue
			}
			if seen[i] {
				return apierror.BadRequest("duplicate_key", f,
					"the body names %q more than once; send it once (engines read the last, routing would read the first)", f)
			}
			seen[i] = true
		}
	}
	return nil
}

// laxBool reads a pydantic bool: true/false, 0/1 (also 0.0/1.0), or one of the strings
// pydantic accepts, in any case; null or absent is false.
func laxBool(v gjson.Result, field string) (bool, error) {
	switch v.Type {
	case gjson.Null:
		return false, nil
	case gjson.True:
		return true, nil
	case gjson.False:
		return false, nil
	case gjson.Number:
		if f, err := strconv.ParseFloat(v.Raw, 64); err == nil && (f == 0 || f == 1) {
			return f == 1, nil
		}
	case gjson.String:
		switch strings.ToLower(v.Str) {
		case "1", "on", "t", "true", "y", "yes":
			return true, nil
		case "0", "off", "f", "false", "n", "no":
			return false, nil
		}
	}
	return false, apierror.BadRequest("bad_"+field, field, "%q must be a boolean (true or false), not %s", field, describe(v))
}

// laxCount checks a pydantic Optional[int] that counts tokens: null or absent; an integer, or
// a number or numeric string with no fractional part; finite (a JSON 1e309 is infinite, which
// pydantic refuses); and, as vLLM's sampling parameters require, 0 or more.
func laxCount(v gjson.Result, field string) error {
	var f float64
	var err error
	switch v.Type {
	case gjson.Null, gjson.True, gjson.False: // absent, or a bool (an int in lax mode)
		return nil
	case gjson.Number:
		f, err = strconv.ParseFloat(v.Raw, 64)
	case gjson.String:
		f, err = strconv.ParseFloat(strings.TrimSpace(v.Str), 64)
	default:
		err = strconv.ErrSyntax
	}
	switch {
	case err != nil && !math.IsInf(f, 0):
		return apierror.BadRequest("bad_"+field, field, "%q must be an integer, not %s", field, describe(v))
	case math.IsInf(f, 0) || math.IsNaN(f):
		return apierror.BadRequest("bad_"+field, field, "%q must be a finite integer, not %s", field, describe(v))
	case f != math.Trunc(f):
		return apierror.BadRequest("bad_"+field, field, "%q must be an integer, not %s", field, describe(v))
	case f < 0:
		return apierror.BadRequest("bad_"+field, field, "%q must be 0 or more, not %s", field, truncate(v.Raw, 40))
	}
	return nil
}

// describe names a value for an error message: its kind, and a short excerpt of scalars.
func describe(v gjson.Result) string {
	switch v.Type {
	case gjson.Number, gjson.True, gjson.False:
		return kind(v) + " (" + truncate(v.Raw, 40) + ")"
	case gjson.String:
		return "the string " + strconv.Quote(truncate(v.Str, 40))
	}
	return kind(v)
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return clean(s, n) + "…"
}

// promptText reads a completions prompt: a string, a list of strings, a list of token ids or a
// list of such lists (vLLM's Union[list[int], list[list[int]], str, list[str]]); it may be
// absent when prompt_embeds carries the prompt. Token ids are counted, not tokenised: a list
// of lists is as long as all its ids (the batch's prompts, each prefilled).
func promptText(v, embeds gjson.Result) (prompted, error) {
	switch {
	case v.Type == gjson.String:
		return text(v.Str), nil
	case (!v.Exists() || v.Type == gjson.Null) && embeds.Exists() && embeds.Type != gjson.Null:
		return text(""), nil
	case !v.Exists() || v.Type == gjson.Null:
		return prompted{}, apierror.BadRequest("missing_prompt", "prompt", "the completions API needs \"prompt\" (a string, a list of strings or token ids)")
	case v.IsArray():
		var sb strings.Builder
		var shape string // "text", "ids" or "lists", from the first item
		ids := 0
		ok := true
		v.ForEach(func(_, item gjson.Result) bool {
			var s string
			switch {
			case item.Type == gjson.String:
				s = "text"
				sb.WriteString(item.Str)
			case tokenID(item):
				s = "ids"
				ids++
				sb.WriteString(item.Raw) // token ids keep their text form for hashing
				sb.WriteByte(' ')
			case item.IsArray() && allTokenIDs(item):
				s = "lists"
				ids += len(item.Array())
				sb.WriteString(item.Raw)
				sb.WriteByte(' ')
			}
			if s == "" || (shape != "" && s != shape) {
				ok = false
			}
			shape = s
			return ok
		})
		switch {
		case !ok:
		case shape == "ids" || shape == "lists":
			return prompted{hash: sb.String(), ids: ids}, nil
		default:
			return text(sb.String()), nil
		}
	}
	return prompted{}, apierror.BadRequest("bad_prompt", "prompt", "\"prompt\" must be a string, a list of strings, a list of token ids or a list of token id lists, not a mix")
}

// tokenID is a pydantic int: a whole, finite number (or a bool).
func tokenID(v gjson.Result) bool {
	if v.Type == gjson.True || v.Type == gjson.False {
		return true
	}
	if v.Type != gjson.Number {
		return false
	}
	f, err := strconv.ParseFloat(v.Raw, 64)
	return err == nil && f == math.Trunc(f)
}

func allTokenIDs(list gjson.Result) bool {
	ok := true
	list.ForEach(func(_, id gjson.Result) bool { ok = tokenID(id); return ok })
	return ok
}

// chatPrompt reads chat completions messages: the hashed text (chatText) and the counted one
// (countText).
func chatPrompt(v gjson.Result) (prompted, error) {
	h, err := chatText(v)
	if err != nil {
		return prompted{}, err
	}
	return prompted{hash: h, count: countText(v), ids: -1}, nil
}

// chatText concatenates roles and text content of the messages, in order. A message is an
// object with a string role; its content is a string, a list of content parts (objects, or
// bare strings, which vLLM takes as text), null or absent. An empty list is vLLM's business.
func chatText(v gjson.Result) (string, error) {
	if !v.Exists() || v.Type == gjson.Null {
		return "", apierror.BadRequest("missing_messages", "messages", "the chat completions API needs \"messages\", a list of {\"role\", \"content\"} objects")
	}
	if !v.IsArray() {
		return "", apierror.BadRequest("bad_messages", "messages", "\"messages\" must be a list of {\"role\", \"content\"} objects, not %s", kind(v))
	}
	var sb strings.Builder
	var bad error
	i := 0
	v.ForEach(func(_, m gjson.Result) bool {
		n := i
		i++
		at := func() string { return fmt.Sprintf("messages[%d]", n) } // for errors only
		if !m.IsObject() {
			bad = apierror.BadRequest("bad_messages", at(), "%s must be a {\"role\", \"content\"} object, not %s", at(), kind(m))
			return false
		}
		role := m.Get("role")
		if role.Type != gjson.String {
			what := "is missing"
			if role.Exists() {
				what = "must be a string, not " + describe(role)
			}
			bad = apierror.BadRequest("bad_messages", at()+".role", "%s.role %s", at(), what)
			return false
		}
		sb.WriteString(role.Str)
		sb.WriteByte('\n')
		c := m.Get("content")
		switch {
		case c.Type == gjson.String:
			sb.WriteString(c.Str)
		case c.IsArray():
			j := 0
			c.ForEach(func(_, part gjson.Result) bool {
				switch {
				case part.Type == gjson.String:
					sb.WriteString(part.Str)
				case part.IsObject():
					if t := part.Get("text"); t.Type == gjson.String {
						sb.WriteString(t.Str)
					}
				default:
					p := fmt.Sprintf("%s.content[%d]", at(), j)
					bad = apierror.BadRequest("bad_messages", p, "%s must be a content part (an object such as {\"type\": \"text\", \"text\": ...}), not %s", p, describe(part))
					return false
				}
				j++
				return true
			})
		case c.Type == gjson.Number || c.Type == gjson.True || c.Type == gjson.False:
			bad = apierror.BadRequest("bad_messages", at()+".content", "%s.content must be a string, a list of content parts or null, not %s", at(), describe(c))
		}
		sb.WriteByte('\n')
		return bad == nil
	})
	if bad != nil {
		return "", bad
	}
	return sb.String(), nil
}
