package app

import (
	"context"
	"fmt"

	"github.com/tandem-epp/tandem/internal/config"
	"github.com/tandem-epp/tandem/internal/filewatch"
	"github.com/tandem-epp/tandem/internal/pd"
)

// watchConfig applies every new content of the --config-file until ctx ends.
func (a *App) watchConfig(ctx context.Context) {
	a.tel.m.ConfigFileLoaded()
	notifyFailed := func(err error) {
		a.log.Error(err, "no change notifications for the --config-file; it is re-read on a timer")
	}
	filewatch.Watch(ctx, a.opts.ConfigFile, a.configData, filewatch.Options{Poll: a.opts.configPoll, NotifyFailed: notifyFailed},
		func(data []byte) { _ = a.applyConfig(data) },
		func(err error) { a.rejectConfig(fmt.Errorf("--config-file: %w", err)) })
}

// applyConfig checks a new content of the --config-file as the start does (plugins,
// parameters, profiles, gateway: with the environment over it), builds everything it names,
// and swaps it into the router at once. A bad file changes nothing: the last good
// configuration keeps routing, and the log and tandem_config_reloads_total say so.
func (a *App) applyConfig(data []byte) error {
	path := a.opts.ConfigFile
	f, err := config.ParseFile(path, data, config.FileOptions{KnownPluginTypes: pd.IsPluginType})
	var gw config.Gateway
	if err == nil {
		var warns []config.Warning
		gw, warns, err = config.Load(f, a.getenv)
		for _, w := range warns {
			a.log.Info("configuration warning", "warning", w.String())
		}
	}
	var warnings []string
	if err == nil {
		warnings, err = a.picker.Reload(f, gw)
	}
	if err != nil {
		a.rejectConfig(err)
		return err
	}
	for _, w := range warnings {
		a.log.Info("config file warning", "warning", w)
	}
	if later := config.RestartOnly(a.gw, gw); len(later) > 0 {
		a.log.Info("config file changes settings read only at start; they take effect at the next restart", "settings", later)
	}
	a.tel.m.ConfigReload(true)
	a.log.Info("config file reloaded", "path", path, "strategies", a.router.Strategies(), "default", a.router.Default())
	return nil
}

func (a *App) rejectConfig(err error) {
	a.tel.m.ConfigReload(false)
	a.log.Error(err, "config file rejected; the last good configuration keeps routing", "path", a.opts.ConfigFile)
}
