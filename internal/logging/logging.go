package logging

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Options are the logger's settings, bound to flags by BindFlags. The zero value is production
// logging: JSON lines on stderr at info level, stack traces from error level, RFC 3339 times.
type Options struct {
	// Development switches the defaults to console lines, debug level and stack traces from
	// warn level (--zap-devel).
	Development bool
	// Encoder is "json" or "console" ("": the mode's default).
	Encoder string
	// Level enables messages at and above it; logr's V(n) is zap level -n (nil: the mode's default).
	Level *zapcore.Level
	// StacktraceLevel captures stack traces at and above it (nil: the mode's default).
	StacktraceLevel *zapcore.Level
	// TimeEncoding names the time format ("": rfc3339).
	TimeEncoding string
	// DestWriter receives the log (nil: os.Stderr).
	DestWriter io.Writer
}

var levelNames = map[string]zapcore.Level{"debug": zapcore.DebugLevel, "info": zapcore.InfoLevel,
	"error": zapcore.ErrorLevel, "panic": zapcore.PanicLevel}

var stackNames = map[string]zapcore.Level{"info": zapcore.InfoLevel, "error": zapcore.ErrorLevel, "panic": zapcore.PanicLevel}

var timeEncoders = map[string]zapcore.TimeEncoder{
	"epoch": zapcore.EpochTimeEncoder, "millis": zapcore.EpochMillisTimeEncoder, "nanos": zapcore.EpochNanosTimeEncoder,
	"iso8601": zapcore.ISO8601TimeEncoder, "rfc3339": zapcore.RFC3339TimeEncoder, "rfc3339nano": zapcore.RFC3339NanoTimeEncoder,
}

// funcValue is a flag.Value that parses with set and shows value.
type funcValue struct {
	value *string
	set   func(string) error
}

func (f funcValue) String() string {
	if f.value == nil {
		return ""
	}
	return *f.value
}

func (f funcValue) Set(s string) error {
	if err := f.set(s); err != nil {
		return err
	}
	*f.value = s
	return nil
}

// BindFlags adds --zap-devel, --zap-encoder, --zap-log-level, --zap-stacktrace-level and
// --zap-time-encoding to fs.
func (o *Options) BindFlags(fs *flag.FlagSet) {
	fs.BoolVar(&o.Development, "zap-devel", o.Development,
		"Development mode defaults (console encoder, debug level, stack traces from warn); production defaults are json, info, error")
	var enc, lvl, stack, tenc string
	fs.Var(funcValue{&enc, func(s string) error {
		e := strings.ToLower(s)
		if e != "json" && e != "console" {
			return fmt.Errorf("%q is not an encoder (json or console)", s)
		}
		o.Encoder = e
		return nil
	}}, "zap-encoder", "Log encoding: json or console")
	fs.Var(funcValue{&lvl, func(s string) error {
		l, err := ParseLevel(s)
		if err != nil {
			return err
		}
		o.Level = &l
		return nil
	}}, "zap-log-level", "Log verbosity: debug, info, error, panic, or an integer n > 0 for debug levels of increasing verbosity (logr V(n))")
	fs.Var(funcValue{&stack, func(s string) error {
		l, ok := stackNames[strings.ToLower(s)]
		if !ok {
			return fmt.Errorf("%q is not a stack trace level (info, error or panic)", s)
		}
		o.StacktraceLevel = &l
		return nil
	}}, "zap-stacktrace-level", "Level at and above which stack traces are captured: info, error or panic")
	fs.Var(funcValue{&tenc, func(s string) error {
		if _, ok := timeEncoders[strings.ToLower(s)]; !ok {
			return fmt.Errorf("%q is not a time encoding (epoch, millis, nanos, iso8601, rfc3339 or rfc3339nano)", s)
		}
		o.TimeEncoding = strings.ToLower(s)
		return nil
	}}, "zap-time-encoding", "Time encoding: epoch, millis, nanos, iso8601, rfc3339 (default) or rfc3339nano")
}

// ParseLevel reads a --zap-log-level value: a level name, or n > 0 for logr's V(n).
func ParseLevel(s string) (zapcore.Level, error) {
	if l, ok := levelNames[strings.ToLower(s)]; ok {
		return l, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 || n > 127 {
		return 0, fmt.Errorf("%q is not a log level (debug, info, error, panic, or an integer from 1 to 127)", s)
	}
	return zapcore.Level(int8(-n)), nil
}

// New returns the logger o describes.
func New(o Options) logr.Logger {
	return zapr.NewLogger(NewZap(o))
}

// NewZap returns the zap logger behind New.
func NewZap(o Options) *zap.Logger {
	encoder, level, stack := "json", zapcore.InfoLevel, zapcore.ErrorLevel
	if o.Development {
		encoder, level, stack = "console", zapcore.DebugLevel, zapcore.WarnLevel
	}
	if o.Encoder != "" {
		encoder = o.Encoder
	}
	if o.Level != nil {
		level = *o.Level
	}
	if o.StacktraceLevel != nil {
		stack = *o.StacktraceLevel
	}
	var ecfg zapcore.EncoderConfig
	if encoder == "console" {
		ecfg = zap.NewDevelopmentEncoderConfig()
	} else {
		ecfg = zap.NewProductionEncoderConfig()
	}
	ecfg.EncodeTime = zapcore.RFC3339TimeEncoder
	if te, ok := timeEncoders[o.TimeEncoding]; ok {
		ecfg.EncodeTime = te
	}
	var enc zapcore.Encoder
	if encoder == "console" {
		enc = zapcore.NewConsoleEncoder(ecfg)
	} else {
		enc = zapcore.NewJSONEncoder(ecfg)
	}
	dest := o.DestWriter
	if dest == nil {
		dest = os.Stderr
	}
	sink := zapcore.AddSync(dest)
	opts := []zap.Option{zap.ErrorOutput(sink), zap.AddStacktrace(stack)}
	if o.Development {
		opts = append(opts, zap.Development())
	} else if level >= zapcore.Level(-1) {
		// Production at info or debug: sample bursts of identical lines, as controller-runtime
		// does (never at deeper V levels, where zap's sampler does not apply).
		opts = append(opts, zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			return zapcore.NewSamplerWithOptions(c, time.Second, 100, 100)
		}))
	}
	return zap.New(zapcore.NewCore(enc, sink, zap.NewAtomicLevelAt(level)), opts...)
}
