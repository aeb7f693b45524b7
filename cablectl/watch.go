package cablectl

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"time"
)

// clearScreen moves the cursor home and clears the terminal (ANSI), as watch(1) redraws.
const clearScreen = "\x1b[H\x1b[2J"

// watchStatus renders every interval until ctx ends and writes a frame only when it differs from
// the last one written: tables redraw the screen with a header naming when the status last
// changed; JSON and YAML append each changed document (YAML separated by ---), to pipe into
// other tools. An agent that cannot be reached is a frame of its own (the error), not the end of
// the watch. The "ago" columns count in seconds, so a table changes at most once a second.
func watchStatus(ctx context.Context, w io.Writer, format string, interval time.Duration, render func(context.Context) ([]byte, error)) error {
	var last []byte
	first := true
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		frame, err := render(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			frame = []byte("Error: " + err.Error() + "\n")
		}
		if first || !bytes.Equal(frame, last) {
			var out bytes.Buffer
			switch format {
			case "json":
				out.Write(frame)
			case "yaml":
				if !first {
					out.WriteString("---\n")
				}
				out.Write(frame)
			default:
				fmt.Fprintf(&out, "%sEvery %s: cablectl status (changed %s)\n\n", clearScreen, interval, time.Now().Format("15:04:05"))
				out.Write(frame)
			}
			if _, err := w.Write(out.Bytes()); err != nil {
				return err
			}
			last, first = frame, false
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
