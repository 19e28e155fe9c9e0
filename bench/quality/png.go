package main

import "strings"

func (r *report) pictures(md *strings.Builder, wi wlInfo) error { return nil }
