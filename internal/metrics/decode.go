package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"sync"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
)

// errBodyTooLarge is returned when a metrics page exceeds ScrapeOptions.MaxBodyBytes.
var errBodyTooLarge = errors.New("metrics body exceeds the size limit")

// limitReader fails (instead of silently truncating) once more than n bytes were read.
type limitReader struct {
	r io.Reader
	n int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		// One probe byte distinguishes "exactly at the limit" from "over it".
		var b [1]byte
		if k, err := l.r.Read(b[:]); k > 0 {
			return 0, errBodyTooLarge
		} else if err != nil {
			return 0, err
		}
		return 0, nil
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	k, err := l.r.Read(p)
	l.n -= int64(k)
	return k, err
}

// decodeFamilies parses a metrics page in the format its Content-Type names (Prometheus text or
// OpenMetrics; text when the type is missing or unknown) and returns the families in want.
//
// The page is read whole (bounded by the caller's reader) and only the lines of wanted families
// are handed to the Prometheus parser: an engine page is ~800 lines of histograms of which the
// scraper needs ~20, and parsing all of them was 90% of a scrape's CPU (bench/metrics). The
// filter only looks at the metric name at the start of a line; values, labels and escaping are
// still parsed by expfmt.
func decodeFamilies(body io.Reader, contentType string, want map[string]bool) (map[string]*dto.MetricFamily, error) {
	if mt, _, err := mime.ParseMediaType(contentType); err == nil && (mt == "application/json" || mt == "text/html") {
		return nil, fmt.Errorf("server answered %s, not Prometheus metrics: check the metrics path (trtllm-serve serves Prometheus at /prometheus/metrics)", mt)
	}
	format := expfmt.ResponseFormat(headerWithContentType(contentType))
	openMetrics := format.FormatType() == expfmt.TypeOpenMetrics
	if !openMetrics && format.FormatType() != expfmt.TypeTextPlain {
		format = expfmt.NewFormat(expfmt.TypeTextPlain)
	}

	page := bufPool.Get().(*bytes.Buffer)
	kept := bufPool.Get().(*bytes.Buffer)
	defer func() { page.Reset(); kept.Reset(); bufPool.Put(page); bufPool.Put(kept) }()
	if _, err := page.ReadFrom(body); err != nil {
		return nil, err
	}
	var hist *histAcc
	if !openMetrics {
		hist = &histAcc{}
	}
	if err := filterLines(page.Bytes(), kept, want, hist); err != nil {
		return nil, err
	}

	dec := expfmt.NewDecoder(bytes.NewReader(kept.Bytes()), format)
	out := make(map[string]*dto.MetricFamily, len(want))
	if hist != nil {
		for name, mf := range hist.fams {
			out[name] = mf
		}
	}
	for {
		mf := &dto.MetricFamily{}
		err := dec.Decode(mf)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if want[mf.GetName()] && out[mf.GetName()] == nil {
			out[mf.GetName()] = mf
		}
	}
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// sampleSuffixes are the endings a sample name may add to its family name. In the text format
// only _bucket, _sum and _count belong to a family (_created is its own gauge family there, and
// counters keep _total in the family name); OpenMetrics also strips _total, _created, _info, _gsum
// and _gcount.
var (
	textSuffixes = [][]byte{[]byte("_bucket"), []byte("_sum"), []byte("_count")}
	omSuffixes   = [][]byte{[]byte("_bucket"), []byte("_sum"), []byte("_count"), []byte("_total"),
		[]byte("_created"), []byte("_info"), []byte("_gsum"), []byte("_gcount")}
	bucketSuffix = []byte("_bucket")
	helpPrefix   = []byte("# HELP ")
	typePrefix   = []byte("# TYPE ")
	unitPrefix   = []byte("# UNIT ")
)

// filterLines copies the lines of wanted families into dst. In the text format (hist not
// nil) HELP lines and _bucket series are dropped too — the parser does not need the former,
// and the scraper reads only a histogram's _sum and _count — and those _sum and _count lines
// (with their family's TYPE line) are read straight into hist instead of going through the
// Prometheus parser, which costs far more per line. OpenMetrics pages keep their families
// whole, since its parser checks their structure.
func filterLines(page []byte, dst *bytes.Buffer, want map[string]bool, hist *histAcc) error {
	text := hist != nil
	suffixes := omSuffixes
	if text {
		suffixes = textSuffixes
	}
	for len(page) > 0 {
		var line []byte
		if i := bytes.IndexByte(page, '\n'); i >= 0 {
			line, page = page[:i+1], page[i+1:]
		} else {
			line, page = page, nil
		}
		if text {
			if fam, isSum, n := histLine(line, want); n > 0 {
				if err := hist.add(fam, isSum, line[n:]); err != nil {
					return err
				}
				continue
			}
			if histTypeLine(line, want) {
				continue
			}
		}
		if keepLine(line, want, suffixes, text) {
			dst.Write(line)
			if line[len(line)-1] != '\n' {
				dst.WriteByte('\n')
			}
		}
	}
	return nil
}

func keepLine(line []byte, want map[string]bool, suffixes [][]byte, text bool) bool {
	if len(line) == 0 || line[0] == '\n' {
		return false
	}
	if line[0] == '#' {
		// "# HELP name …", "# TYPE name …", "# UNIT name …"; other comments (# EOF) are kept.
		if len(line) < 8 {
			return true
		}
		switch {
		case bytes.HasPrefix(line, helpPrefix):
			if text {
				return false
			}
		case bytes.HasPrefix(line, typePrefix), bytes.HasPrefix(line, unitPrefix):
		default:
			return true
		}
		name := line[7:]
		return wanted(name[:nameEnd(name)], want, suffixes) != notWanted
	}
	if line[0] == '{' {
		return true // a quoted UTF-8 name: leave it to the parser
	}
	end := nameEnd(line)
	if end == len(line) {
		return true // malformed: let the parser report it
	}
	switch wanted(line[:end], want, suffixes) {
	case notWanted:
		return false
	case wantedBucket:
		return !text
	}
	return true
}

// nameEnd is the length of the metric name at the start of b (names hold no '{', ' ' or tab).
func nameEnd(b []byte) int {
	end := len(b)
	if i := bytes.IndexByte(b, ' '); i >= 0 {
		end = i
	}
	if i := bytes.IndexByte(b[:end], '{'); i >= 0 {
		end = i
	}
	if i := bytes.IndexByte(b[:end], '\t'); i >= 0 {
		end = i
	}
	if i := bytes.IndexByte(b[:end], '\n'); i >= 0 {
		end = i
	}
	return end
}

const (
	notWanted = iota
	wantedSeries
	wantedBucket
)

// wanted says whether a sample or family name belongs to a wanted family, and whether it is a
// histogram bucket series.
func wanted(name []byte, want map[string]bool, suffixes [][]byte) int {
	if want[string(name)] {
		return wantedSeries
	}
	for _, suf := range suffixes {
		if bytes.HasSuffix(name, suf) && want[string(name[:len(name)-len(suf)])] {
			if bytes.Equal(suf, bucketSuffix) {
				return wantedBucket
			}
			return wantedSeries
		}
	}
	return notWanted
}

func headerWithContentType(ct string) http.Header {
	h := http.Header{}
	h.Set("Content-Type", ct)
	return h
}
