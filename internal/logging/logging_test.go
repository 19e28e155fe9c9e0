package logging

import (
	"bytes"
	"encoding/json"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func parse(t *testing.T, args ...string) (*Options, error) {
	t.Helper()
	o := &Options{}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.BindFlags(fs)
	return o, fs.Parse(args)
}

// Production output: one JSON object a line, RFC 3339 times, info and up; V(1) only with
// --zap-log-level=1 or deeper.
func TestProductionLines(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		wantV1  bool
		wantInf bool
	}{
		{nil, false, true},
		{[]string{"--zap-log-level=debug"}, true, true},
		{[]string{"--zap-log-level=2"}, true, true},
		{[]string{"--zap-log-level=error"}, false, false},
	} {
		o, err := parse(t, tc.args...)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		o.DestWriter = &buf
		log := New(*o)
		log.Info("hello", "k", 1)
		log.V(1).Info("verbose")
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		var got []string
		for _, l := range lines {
			if l == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("%v: not a JSON line: %q", tc.args, l)
			}
			if _, err := time.Parse(time.RFC3339, m["ts"].(string)); err != nil {
				t.Errorf("%v: ts %v is not RFC 3339", tc.args, m["ts"])
			}
			got = append(got, m["msg"].(string))
		}
		want := []string{}
		if tc.wantInf {
			want = append(want, "hello")
		}
		if tc.wantV1 {
			want = append(want, "verbose")
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%v: logged %v, want %v", tc.args, got, want)
		}
	}
}

func TestConsoleAndTimeEncoding(t *testing.T) {
	o, err := parse(t, "--zap-encoder=console", "--zap-time-encoding=epoch")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	o.DestWriter = &buf
	New(*o).Info("hello")
	line := buf.String()
	if strings.HasPrefix(line, "{") || !strings.Contains(line, "hello") {
		t.Errorf("console line %q", line)
	}
	if f := strings.Fields(line); len(f) == 0 || !strings.Contains(f[0], ".") || strings.Contains(f[0], "T") {
		t.Errorf("epoch time expected first, got %q", line)
	}
}

// The values controller-runtime's flags take (case-insensitive names, its time encodings) are
// taken here too, so manifests written for other EPPs keep working.
func TestControllerRuntimeValues(t *testing.T) {
	for _, arg := range []string{"--zap-encoder=JSON", "--zap-encoder=console", "--zap-log-level=Info", "--zap-log-level=5",
		"--zap-stacktrace-level=Panic", "--zap-time-encoding=nanos", "--zap-time-encoding=RFC3339Nano",
		"--zap-time-encoding=millis", "--zap-time-encoding=iso8601", "--zap-time-encoding=epoch", "--zap-devel"} {
		if _, err := parse(t, arg); err != nil {
			t.Errorf("%s: %v", arg, err)
		}
	}
}

func TestBadFlagValues(t *testing.T) {
	for _, tc := range []struct{ arg, want string }{
		{"--zap-log-level=loud", `"loud" is not a log level (debug, info, error, panic, or an integer from 1 to 127)`},
		{"--zap-log-level=0", `"0" is not a log level`},
		{"--zap-encoder=xml", `"xml" is not an encoder (json or console)`},
		{"--zap-stacktrace-level=debug", `"debug" is not a stack trace level (info, error or panic)`},
		{"--zap-time-encoding=unix", `"unix" is not a time encoding`},
	} {
		_, err := parse(t, tc.arg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want it to contain %q", tc.arg, err, tc.want)
		}
	}
}

// Stack traces: from error level in production, at every level asked for with info.
func TestStacktraceLevel(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		infoStack bool
	}{{nil, false}, {[]string{"--zap-stacktrace-level=info"}, true}} {
		o, err := parse(t, tc.args...)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		o.DestWriter = &buf
		New(*o).Info("hello")
		if got := strings.Contains(buf.String(), `"stacktrace"`); got != tc.infoStack {
			t.Errorf("%v: stack trace on an info line %v, want %v", tc.args, got, tc.infoStack)
		}
	}
}
