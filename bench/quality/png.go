package main

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// Pictures are drawn with image/png only (no fonts): axes, light grid lines at the tick
// values the caption states, one coloured line per policy; the legend is in the markdown.

var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 255}, {0xff, 0x7f, 0x0e, 255}, {0x2c, 0xa0, 0x2c, 255}, {0xd6, 0x27, 0x28, 255},
	{0x94, 0x67, 0xbd, 255}, {0x8c, 0x56, 0x4b, 255}, {0xe3, 0x77, 0xc2, 255}, {0x7f, 0x7f, 0x7f, 255},
	{0xbc, 0xbd, 0x22, 255}, {0x17, 0xbe, 0xcf, 255},
}

const (
	plotW, plotH = 800, 480
	marginL      = 56
	marginB      = 28
	marginT      = 24
	marginR      = 16
)

type canvas struct {
	img        *image.RGBA
	x0, x1     float64
	y0, y1     float64
	logX       bool
	innerW     int
	innerH     int
	grid, axis color.RGBA
}

func newCanvas(x0, x1, y0, y1 float64, logX bool) *canvas {
	img := image.NewRGBA(image.Rect(0, 0, plotW, plotH))
	for i := range img.Pix {
		img.Pix[i] = 255
	}
	c := &canvas{img: img, x0: x0, x1: x1, y0: y0, y1: y1, logX: logX,
		innerW: plotW - marginL - marginR, innerH: plotH - marginT - marginB,
		grid: color.RGBA{225, 225, 225, 255}, axis: color.RGBA{0, 0, 0, 255}}
	return c
}

func (c *canvas) px(x, y float64) (int, int) {
	fx := (x - c.x0) / (c.x1 - c.x0)
	if c.logX {
		fx = (math.Log10(x) - math.Log10(c.x0)) / (math.Log10(c.x1) - math.Log10(c.x0))
	}
	fy := (y - c.y0) / (c.y1 - c.y0)
	return marginL + int(fx*float64(c.innerW)), marginT + c.innerH - int(fy*float64(c.innerH))
}

func (c *canvas) set(x, y int, col color.RGBA) {
	if image.Pt(x, y).In(c.img.Rect) {
		c.img.SetRGBA(x, y, col)
	}
}

// line draws a thick segment between pixel points (Bresenham, 2 px wide).
func (c *canvas) line(ax, ay, bx, by int, col color.RGBA, thick int) {
	dx, dy := abs(bx-ax), -abs(by-ay)
	sx, sy := sign(bx-ax), sign(by-ay)
	err := dx + dy
	for {
		for t := 0; t < thick; t++ {
			c.set(ax+t, ay, col)
			c.set(ax, ay+t, col)
		}
		if ax == bx && ay == by {
			return
		}
		e2 := 2 * err
		if e2 >= dy {
			err += dy
			ax += sx
		}
		if e2 <= dx {
			err += dx
			ay += sy
		}
	}
}

func (c *canvas) frame(xticks, yticks []float64) {
	for _, t := range xticks {
		x, _ := c.px(t, c.y0)
		c.line(x, marginT, x, marginT+c.innerH, c.grid, 1)
	}
	for _, t := range yticks {
		_, y := c.px(c.x0, t)
		c.line(marginL, y, marginL+c.innerW, y, c.grid, 1)
	}
	c.line(marginL, marginT+c.innerH, marginL+c.innerW, marginT+c.innerH, c.axis, 2)
	c.line(marginL, marginT, marginL, marginT+c.innerH, c.axis, 2)
}

func (c *canvas) poly(xs, ys []float64, col color.RGBA) {
	for i := 1; i < len(xs); i++ {
		ax, ay := c.px(xs[i-1], ys[i-1])
		bx, by := c.px(xs[i], ys[i])
		c.line(ax, ay, bx, by, col, 2)
	}
	for i := range xs { // markers
		x, y := c.px(xs[i], ys[i])
		if len(xs) < 12 {
			for u := -3; u <= 3; u++ {
				for v := -3; v <= 3; v++ {
					c.set(x+u, y+v, col)
				}
			}
		}
	}
}

// text writes s (upper-cased) with its top-left corner at pixel (x, y), 2× scaled when big.
func (c *canvas) text(x, y int, s string, col color.RGBA, big bool) {
	k := 1
	if big {
		k = 2
	}
	for _, r := range strings.ToUpper(s) {
		g, ok := font5x7[r]
		if ok {
			for row := 0; row < 7; row++ {
				for bit := 0; bit < 5; bit++ {
					if g[row]&(1<<(4-bit)) != 0 {
						for u := 0; u < k; u++ {
							for v := 0; v < k; v++ {
								c.set(x+bit*k+u, y+row*k+v, col)
							}
						}
					}
				}
			}
		}
		x += 6 * k
	}
}

// textWidth is the pixel width of s at scale 1.
func textWidth(s string) int { return 6 * len([]rune(s)) }

// xlabel centres a tick label under the x axis at data x.
func (c *canvas) xlabel(x float64, s string) {
	px, _ := c.px(x, c.y0)
	c.text(px-textWidth(s)/2, marginT+c.innerH+6, s, c.axis, false)
}

// ylabel right-aligns a tick label left of the y axis at data y.
func (c *canvas) ylabel(y float64, s string) {
	_, py := c.px(c.x0, y)
	c.text(marginL-6-textWidth(s), py-3, s, c.axis, false)
}

// legend lists names with their colours in a white box whose top-left corner is (x, y).
func (c *canvas) legend(x, y int, names []string, cols []color.RGBA) {
	w := 0
	for _, n := range names {
		w = max(w, textWidth(n))
	}
	h := 12*len(names) + 6
	for i := x; i < x+w+26; i++ {
		for j := y; j < y+h; j++ {
			c.set(i, j, color.RGBA{255, 255, 255, 255})
		}
	}
	c.line(x, y, x+w+26, y, c.grid, 1)
	c.line(x, y+h, x+w+26, y+h, c.grid, 1)
	c.line(x, y, x, y+h, c.grid, 1)
	c.line(x+w+26, y, x+w+26, y+h, c.grid, 1)
	for i, n := range names {
		for u := 0; u < 12; u++ {
			for v := 0; v < 7; v++ {
				c.set(x+5+u, y+5+12*i+v, cols[i])
			}
		}
		c.text(x+21, y+5+12*i, n, c.axis, false)
	}
}

func (c *canvas) save(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := png.Encode(f, c.img); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}

func sign(x int) int {
	switch {
	case x > 0:
		return 1
	case x < 0:
		return -1
	}
	return 0
}

func colorHex(c color.RGBA) string { return fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B) }

// pictures draws, for one workload, the TTFT CDF of every policy at 100 % load (log x axis,
// 10 ms to 100 s, grid at each decade; y 0..1, grid every 0.1) and goodput against load, and
// links them from the markdown with the colour legend.
func (r *report) pictures(md *strings.Builder, wi wlInfo) error {
	name := fmt.Sprintf("%s_%s", wi.w.name, strings.NewReplacer("+", "_", "x", "x").Replace(wi.cluster))
	cdf := newCanvas(0.01, 100, 0, 1, true)
	cdf.frame([]float64{0.01, 0.1, 1, 10, 100}, []float64{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1})
	for i, l := range []string{"10ms", "100ms", "1s", "10s", "100s"} {
		cdf.xlabel([]float64{0.01, 0.1, 1, 10, 100}[i], l)
	}
	for _, y := range []float64{0, 0.5, 1} {
		cdf.ylabel(y, fmt.Sprintf("%.1f", y))
	}
	cdf.text(marginL, 4, fmt.Sprintf("TTFT CDF  %s  %s  load %.0f%%", wi.w.name, wi.cluster, resultLoad*100), cdf.axis, false)
	maxG := 0.0
	for _, c := range r.cells {
		if c.workload == wi.w.name && c.cluster == wi.cluster && c.skipped == "" {
			maxG = max(maxG, c.s.goodput)
		}
	}
	maxG = math.Max(1, math.Ceil(maxG*1.1))
	loMax := 0.0
	for _, l := range r.o.loads {
		loMax = max(loMax, l)
	}
	gp := newCanvas(0, loMax*1.05, 0, maxG, false)
	gp.frame(r.o.loads, []float64{maxG / 4, maxG / 2, maxG * 3 / 4, maxG})
	for _, l := range r.o.loads {
		gp.xlabel(l, fmt.Sprintf("%.0f%%", l*100))
	}
	for _, y := range []float64{0, maxG / 4, maxG / 2, maxG * 3 / 4, maxG} {
		gp.ylabel(y, fmt.Sprintf("%.3g", y))
	}
	gp.text(marginL, 4, fmt.Sprintf("SLO goodput (req/s) vs offered load  %s  %s", wi.w.name, wi.cluster), gp.axis, false)
	var names []string
	var cols []color.RGBA
	var legend []string
	for i, p := range r.o.policies {
		col := palette[i%len(palette)]
		drawn := false
		if c := r.find(wi.w.name, wi.cluster, p.name, resultLoad); c != nil && len(c.ttfts) > 0 {
			var xs, ys []float64
			n := len(c.ttfts)
			step := max(1, n/400)
			for k := 0; k < n; k += step {
				xs = append(xs, math.Min(100, math.Max(0.01, c.ttfts[k])))
				ys = append(ys, float64(k+1)/float64(n))
			}
			xs = append(xs, math.Min(100, math.Max(0.01, c.ttfts[n-1])))
			ys = append(ys, 1)
			cdf.poly(xs, ys, col)
			drawn = true
		}
		var lx, ly []float64
		for _, l := range r.o.loads {
			if c := r.find(wi.w.name, wi.cluster, p.name, l); c != nil {
				lx = append(lx, l)
				ly = append(ly, c.s.goodput)
			}
		}
		if len(lx) > 0 {
			gp.poly(lx, ly, col)
			drawn = true
		}
		if drawn {
			names, cols = append(names, p.name), append(cols, col)
			legend = append(legend, fmt.Sprintf("<span style=\"color:%s\">■</span> %s (%s)", colorHex(col), p.name, colorHex(col)))
		}
	}
	cdf.legend(plotW-marginR-200, marginT+cdf.innerH-12*len(names)-16, names, cols)
	gp.legend(marginL+10, marginT+10, names, cols)
	cdfFile, gpFile := "ttft_cdf_"+name+".png", "goodput_"+name+".png"
	for _, dir := range []string{r.o.outDir, r.o.docsDir} {
		if dir == "" {
			continue
		}
		if err := cdf.save(filepath.Join(dir, cdfFile)); err != nil {
			return err
		}
		if err := gp.save(filepath.Join(dir, gpFile)); err != nil {
			return err
		}
	}
	fmt.Fprintf(md, "\n![TTFT CDF, %s](%s) ![goodput vs load, %s](%s)\n\nLeft: TTFT CDF at 100%% load, x log-scale 10 ms…100 s (grid at 10 ms, 100 ms, 1 s, 10 s), y 0…1. "+
		"Right: goodput (req/s, y 0…%.0f, grid every quarter) against offered load (grid at %s of capacity). Colours: %s.\n",
		wi.w.name, cdfFile, wi.w.name, gpFile, maxG, loadsText(r.o.loads), strings.Join(legend, ", "))
	return nil
}

func loadsText(ls []float64) string {
	var s []string
	for _, l := range ls {
		s = append(s, fmt.Sprintf("%.0f%%", l*100))
	}
	return strings.Join(s, ", ")
}
