package metrics

import (
	"bytes"
	"fmt"
	"math"
	"strconv"

	dto "github.com/prometheus/client_model/go"
)

// The scraper reads of a histogram only its _sum and _count series. In the text format those
// are plain "name{labels} value [timestamp]" lines, read here without the Prometheus parser:
// per line it costs far more than the filter, and engines export several histograms Tandem
// wants (prefill, queue, TTFT and inter-token time).

var (
	sumSuffix   = []byte("_sum")
	countSuffix = []byte("_count")
)

// histLine reports whether line is the _sum or _count sample of a wanted family, which, and
// where its sample name ends.
func histLine(line []byte, want map[string]bool) (family string, isSum bool, nameLen int) {
	if len(line) == 0 || line[0] == '#' || line[0] == '{' {
		return "", false, 0
	}
	name := line[:nameEnd(line)]
	if want[string(name)] { // a family of its own name (a gauge ending in _count)
		return "", false, 0
	}
	for _, suf := range [][]byte{sumSuffix, countSuffix} {
		if bytes.HasSuffix(name, suf) {
			fam := name[:len(name)-len(suf)]
			if want[string(fam)] {
				return string(fam), len(suf) == len(sumSuffix), len(name)
			}
		}
	}
	return "", false, 0
}

// histTypeLine reports whether line declares a wanted family a histogram or a summary (its
// samples are read by histLine, so the parser must not see a family without them).
func histTypeLine(line []byte, want map[string]bool) bool {
	if !bytes.HasPrefix(line, typePrefix) {
		return false
	}
	rest := line[len(typePrefix):]
	end := nameEnd(rest)
	if !want[string(rest[:end])] {
		return false
	}
	typ := bytes.TrimSpace(rest[end:])
	return bytes.Equal(typ, []byte("histogram")) || bytes.Equal(typ, []byte("summary"))
}

// histAcc gathers the series of histogram families, a _sum and a _count line per series
// (matched by their label text, which an exposition writes the same way for both).
type histAcc struct {
	fams   map[string]*dto.MetricFamily
	series map[string]*dto.Metric // family + "\x00" + label text
}

// add reads one sample line after its name: "{labels} value [timestamp]" or " value …".
func (h *histAcc) add(family string, isSum bool, rest []byte) error {
	labelText, value, err := splitSample(rest)
	if err != nil {
		return fmt.Errorf("metrics line %s…: %w", family, err)
	}
	if h.fams == nil {
		h.fams, h.series = map[string]*dto.MetricFamily{}, map[string]*dto.Metric{}
	}
	key := family + "\x00" + string(labelText)
	m := h.series[key]
	if m == nil {
		labels, err := parseLabels(labelText)
		if err != nil {
			return fmt.Errorf("metrics line %s%s: %w", family, labelText, err)
		}
		m = &dto.Metric{Label: labels, Histogram: &dto.Histogram{}}
		h.series[key] = m
		mf := h.fams[family]
		if mf == nil {
			typ := dto.MetricType_HISTOGRAM
			mf = &dto.MetricFamily{Name: &family, Type: &typ}
			h.fams[family] = mf
		}
		mf.Metric = append(mf.Metric, m)
	}
	if isSum {
		m.Histogram.SampleSum = &value
	} else {
		c := uint64(0)
		if value > 0 && !math.IsInf(value, 0) && !math.IsNaN(value) {
			c = uint64(value)
		}
		m.Histogram.SampleCount = &c
	}
	return nil
}

// splitSample splits "{labels} value [timestamp]\n" (or " value …") into the label text
// (with its braces, "" without labels) and the value.
func splitSample(rest []byte) ([]byte, float64, error) {
	var labelText []byte
	if len(rest) > 0 && rest[0] == '{' {
		end, err := labelsEnd(rest)
		if err != nil {
			return nil, 0, err
		}
		labelText, rest = rest[:end], rest[end:]
	}
	fields := bytes.Fields(rest)
	if len(fields) == 0 || len(fields) > 2 {
		return nil, 0, fmt.Errorf("want a value (and an optional timestamp) after the name and labels")
	}
	v, err := strconv.ParseFloat(string(fields[0]), 64)
	if err != nil {
		return nil, 0, fmt.Errorf("value %q is not a number", fields[0])
	}
	return labelText, v, nil
}

// labelsEnd is the index just past the "}" closing the label set b starts with.
func labelsEnd(b []byte) (int, error) {
	quoted := false
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case quoted && c == '\\':
			i++ // the escaped byte
		case c == '"':
			quoted = !quoted
		case !quoted && c == '}':
			return i + 1, nil
		case c == '\n':
			return 0, fmt.Errorf("label set not closed")
		}
	}
	return 0, fmt.Errorf("label set not closed")
}

// parseLabels reads `{name="value",…}` (the text format's escapes \\, \" and \n).
func parseLabels(text []byte) ([]*dto.LabelPair, error) {
	if len(text) < 2 {
		return nil, nil
	}
	b := text[1 : len(text)-1]
	var out []*dto.LabelPair
	for {
		b = bytes.TrimLeft(b, " \t,")
		if len(b) == 0 {
			return out, nil
		}
		eq := bytes.IndexByte(b, '=')
		if eq <= 0 {
			return nil, fmt.Errorf("label without a name=\"value\" pair")
		}
		name := string(bytes.TrimSpace(b[:eq]))
		b = bytes.TrimLeft(b[eq+1:], " \t")
		if len(b) == 0 || b[0] != '"' {
			return nil, fmt.Errorf("label %s: value not quoted", name)
		}
		var val []byte
		i := 1
		for ; i < len(b) && b[i] != '"'; i++ {
			if b[i] == '\\' && i+1 < len(b) {
				i++
				switch b[i] {
				case 'n':
					val = append(val, '\n')
				default:
					val = append(val, b[i])
				}
				continue
			}
			val = append(val, b[i])
		}
		if i >= len(b) {
			return nil, fmt.Errorf("label %s: value not closed", name)
		}
		v := string(val)
		out = append(out, &dto.LabelPair{Name: &name, Value: &v})
		b = b[i+1:]
	}
}
