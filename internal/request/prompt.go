package request

import (
	"fmt"
	"strings"

	"github.com/tidwall/gjson"

	"github.com/tandem-epp/tandem/internal/apierror"
)

// prompted is what a body's prompt gives the rest of Tandem: the text prefix hashing reads,
// the text whose tokens bucketing and config-profile: auto count, or, for token ids, their
// number (ids ≥ 0; -1 for a text prompt).
type prompted struct {
	hash, count string
	ids         int
}

// text is a plain-text prompt, hashed and counted as it stands.
func text(s string) prompted { return prompted{hash: s, count: s, ids: -1} }

// countText is the text AIBrix's gateway counts for a list of messages (chat completions,
// Messages) or Responses input items: each item's content joined by one space; string content
// as its text, any other content (content-part arrays, objects, null) as its JSON, as sent; an
// item without content adds nothing but its separator. A Messages request's system prompt and
// a Responses request's instructions are not counted, as AIBrix counts them not.
func countText(items gjson.Result) string {
	var sb strings.Builder
	i := 0
	items.ForEach(func(_, m gjson.Result) bool {
		if i > 0 {
			sb.WriteByte(' ')
		}
		i++
		switch c := m.Get("content"); {
		case c.Type == gjson.String:
			sb.WriteString(c.Str)
		case c.Exists():
			sb.WriteString(c.Raw)
		}
		return true
	})
	return sb.String()
}

// messagesPrompt reads an Anthropic Messages request as vLLM's and SGLang's models validate
// it: "messages" is a list of {"role", "content"} objects whose content is a string or a list
// of content blocks (objects with a string "type"); "system" is null, a string or such a
// list; "max_tokens" is required and positive. The hashed text is the system prompt's text,
// then each message's role and text, as chatText writes them.
func messagesPrompt(msgs, system, maxTokens gjson.Result) (prompted, error) {
	if !maxTokens.Exists() || maxTokens.Type == gjson.Null {
		return prompted{}, apierror.BadRequest("missing_max_tokens", "max_tokens", "the messages API needs \"max_tokens\", a positive integer")
	}
	if n := maxTokens.Float(); n < 1 { // laxCount has checked the shape
		return prompted{}, apierror.BadRequest("bad_max_tokens", "max_tokens", "\"max_tokens\" must be 1 or more, not %s", describe(maxTokens))
	}
	if !msgs.Exists() || msgs.Type == gjson.Null {
		return prompted{}, apierror.BadRequest("missing_messages", "messages", "the messages API needs \"messages\", a list of {\"role\", \"content\"} objects")
	}
	if !msgs.IsArray() {
		return prompted{}, apierror.BadRequest("bad_messages", "messages", "\"messages\" must be a list of {\"role\", \"content\"} objects, not %s", kind(msgs))
	}
	var sb strings.Builder
	switch {
	case system.Type == gjson.String:
		sb.WriteString("system\n")
		sb.WriteString(system.Str)
		sb.WriteByte('\n')
	case system.IsArray():
		sb.WriteString("system\n")
		if err := blocks(system, "system", &sb); err != nil {
			return prompted{}, err
		}
		sb.WriteByte('\n')
	case system.Exists() && system.Type != gjson.Null:
		return prompted{}, apierror.BadRequest("bad_system", "system", "\"system\" must be a string or a list of content blocks, not %s", describe(system))
	}
	var bad error
	i := 0
	msgs.ForEach(func(_, m gjson.Result) bool {
		at := fmt.Sprintf("messages[%d]", i)
		i++
		if !m.IsObject() {
			bad = apierror.BadRequest("bad_messages", at, "%s must be a {\"role\", \"content\"} object, not %s", at, kind(m))
			return false
		}
		role := m.Get("role")
		if role.Type != gjson.String {
			what := "is missing"
			if role.Exists() {
				what = "must be a string, not " + describe(role)
			}
			bad = apierror.BadRequest("bad_messages", at+".role", "%s.role %s", at, what)
			return false
		}
		sb.WriteString(role.Str)
		sb.WriteByte('\n')
		switch c := m.Get("content"); {
		case c.Type == gjson.String:
			sb.WriteString(c.Str)
		case c.IsArray():
			bad = blocks(c, at+".content", &sb)
		default:
			what := "is missing"
			if c.Exists() {
				what = "must be a string or a list of content blocks, not " + describe(c)
			}
			bad = apierror.BadRequest("bad_messages", at+".content", "%s.content %s", at, what)
		}
		sb.WriteByte('\n')
		return bad == nil
	})
	if bad != nil {
		return prompted{}, bad
	}
	return prompted{hash: sb.String(), count: countText(msgs), ids: -1}, nil
}

// blocks checks a list of Anthropic content blocks (objects with a string "type") and writes
// their text to sb.
func blocks(list gjson.Result, at string, sb *strings.Builder) error {
	var bad error
	j := 0
	list.ForEach(func(_, b gjson.Result) bool {
		p := fmt.Sprintf("%s[%d]", at, j)
		j++
		if !b.IsObject() || b.Get("type").Type != gjson.String {
			bad = apierror.BadRequest("bad_content_block", p, "%s must be a content block, an object such as {\"type\": \"text\", \"text\": ...}, not %s", p, describe(b))
			return false
		}
		if t := b.Get("text"); t.Type == gjson.String {
			sb.WriteString(t.Str)
		}
		return true
	})
	return bad
}

// responsesPrompt reads an OpenAI Responses request as vLLM's model validates it: "input" is
// a string or a list of input items (objects); "instructions" is null or a string. The hashed
// text is the instructions, then the input: the string, or each item's role and the text of
// its content (a string, or parts with "text").
func responsesPrompt(input, instructions gjson.Result) (prompted, error) {
	var sb strings.Builder
	switch {
	case instructions.Type == gjson.String:
		sb.WriteString(instructions.Str)
		sb.WriteByte('\n')
	case instructions.Exists() && instructions.Type != gjson.Null:
		return prompted{}, apierror.BadRequest("bad_instructions", "instructions", "\"instructions\" must be a string, not %s", describe(instructions))
	}
	switch {
	case !input.Exists() || input.Type == gjson.Null:
		return prompted{}, apierror.BadRequest("missing_input", "input", "the responses API needs \"input\", a string or a list of input items")
	case input.Type == gjson.String:
		sb.WriteString(input.Str)
		return prompted{hash: sb.String(), count: input.Str, ids: -1}, nil
	case !input.IsArray():
		return prompted{}, apierror.BadRequest("bad_input", "input", "\"input\" must be a string or a list of input items, not %s", describe(input))
	}
	var bad error
	i := 0
	input.ForEach(func(_, item gjson.Result) bool {
		at := fmt.Sprintf("input[%d]", i)
		i++
		if !item.IsObject() {
			bad = apierror.BadRequest("bad_input", at, "%s must be an input item, an object such as {\"role\": \"user\", \"content\": ...}, not %s", at, describe(item))
			return false
		}
		if role := item.Get("role"); role.Type == gjson.String {
			sb.WriteString(role.Str)
			sb.WriteByte('\n')
		}
		switch c := item.Get("content"); {
		case c.Type == gjson.String:
			sb.WriteString(c.Str)
		case c.IsArray():
			c.ForEach(func(_, part gjson.Result) bool {
				if t := part.Get("text"); t.Type == gjson.String {
					sb.WriteString(t.Str)
				}
				return true
			})
		}
		sb.WriteByte('\n')
		return true
	})
	if bad != nil {
		return prompted{}, bad
	}
	return prompted{hash: sb.String(), count: countText(input), ids: -1}, nil
}
