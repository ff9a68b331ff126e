// Package browsertest drives a real headless Chromium from tests, over the
// Chrome DevTools protocol: load a page, read its text as it changes, take
// a screenshot.
//
// # Usage
//
//	b := browsertest.Start(t) // skips the test if there is no chromium
//	b.Navigate(ctx, url)
//	text := b.WaitText(ctx, "held", "expired")
//	b.Screenshot(ctx, filepath.Join(t.TempDir(), "page.png"))
//
// # Caveats
//
// The browser is Debian's chromium package (scripts/services.sh installs
// it). Without it the test is skipped, except under CI=true, where it
// fails: a CI run must not pass by skipping.
package browsertest

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/websocket"
)

// Browser is a running headless Chromium with one page. Its methods are
// safe for concurrent use, though a page does one thing at a time.
type Browser struct {
	t       testing.TB
	ws      *websocket.Conn
	session string

	mu      sync.Mutex
	next    int
	pending map[int]chan reply
	done    chan struct{}
}

type reply struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// Path returns the chromium binary's path. Without one it skips the test,
// or, under CI=true, fails it.
func Path(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium: install Debian's chromium package (make services does)")
	}
	t.Skip("no chromium: install Debian's chromium package (make services does) to run this test")
	return ""
}

// Start runs a headless Chromium with a window of 1280×1000 and one blank
// page, and stops it when the test ends.
func Start(t testing.TB) *Browser {
	t.Helper()
	path := Path(t)
	// Not t.TempDir: Chromium's helper processes may still be writing
	// there for a moment after it exits, which t.TempDir reports.
	profile, err := os.MkdirTemp("", "browsertest-")
	if err != nil {
		t.Fatal(err)
	}
	args := []string{
		"--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
		"--remote-debugging-port=0", "--remote-allow-origins=*",
		"--user-data-dir=" + profile, "--window-size=1280,1000", "about:blank",
	}
	if os.Geteuid() == 0 {
		args = append(args, "--no-sandbox") // Chromium refuses to run as root with its sandbox
	}
	cmd := exec.Command(path, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		os.RemoveAll(profile)
		t.Fatalf("start chromium: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited: // closed through DevTools (below), with its helpers
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		for range 50 { // helpers that outlive it stop writing soon
			if os.RemoveAll(profile) == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	// Chromium prints where its DevTools endpoint listens on stderr.
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if _, url, ok := strings.Cut(sc.Text(), "DevTools listening on "); ok {
				found <- url
			}
		}
		close(found)
	}()
	var url string
	select {
	case u, ok := <-found:
		if !ok {
			t.Fatal("chromium exited without a DevTools endpoint")
		}
		url = u
	case <-time.After(time.Minute):
		t.Fatal("chromium did not open its DevTools endpoint within a minute")
	}
	ws, err := websocket.Dial(url, "", "http://localhost/")
	if err != nil {
		t.Fatalf("connect to chromium at %s: %v", url, err)
	}
	b := &Browser{t: t, ws: ws, pending: make(map[int]chan reply), done: make(chan struct{})}
	go b.read()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = b.call(ctx, "", "Browser.close", nil, nil) // Chromium exits, helpers and all
		ws.Close()
		<-b.done
	})

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var target struct {
		TargetID string `json:"targetId"`
	}
	if err := b.call(ctx, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &target); err != nil {
		t.Fatal(err)
	}
	var attached struct {
		SessionID string `json:"sessionId"`
	}
	if err := b.call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &attached); err != nil {
		t.Fatal(err)
	}
	b.session = attached.SessionID
	if err := b.call(ctx, b.session, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 1280, "height": 1000, "deviceScaleFactor": 1, "mobile": false}, nil); err != nil {
		t.Fatal(err)
	}
	return b
}

// read dispatches replies to their calls; events are ignored.
func (b *Browser) read() {
	defer close(b.done)
	for {
		var msg struct {
			ID int `json:"id"`
			reply
		}
		if err := websocket.JSON.Receive(b.ws, &msg); err != nil {
			b.mu.Lock()
			for id, ch := range b.pending {
				close(ch)
				delete(b.pending, id)
			}
			b.mu.Unlock()
			return
		}
		b.mu.Lock()
		ch := b.pending[msg.ID]
		delete(b.pending, msg.ID)
		b.mu.Unlock()
		if ch != nil {
			ch <- msg.reply
		}
	}
}

// call sends one DevTools command and decodes its result into out.
func (b *Browser) call(ctx context.Context, session, method string, params any, out any) error {
	ch := make(chan reply, 1)
	b.mu.Lock()
	b.next++
	id := b.next
	b.pending[id] = ch
	b.mu.Unlock()
	msg := map[string]any{"id": id, "method": method, "params": params}
	if session != "" {
		msg["sessionId"] = session
	}
	if err := websocket.JSON.Send(b.ws, msg); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	select {
	case r, ok := <-ch:
		switch {
		case !ok:
			return fmt.Errorf("%s: chromium closed the connection", method)
		case r.Error != nil:
			return fmt.Errorf("%s: %s", method, r.Error.Message)
		case out != nil:
			return json.Unmarshal(r.Result, out)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", method, ctx.Err())
	}
}

// Navigate loads url in the page and waits until its document is loaded.
func (b *Browser) Navigate(ctx context.Context, url string) {
	b.t.Helper()
	var nav struct {
		ErrorText string `json:"errorText"`
	}
	if err := b.call(ctx, b.session, "Page.navigate", map[string]any{"url": url}, &nav); err != nil {
		b.t.Fatal(err)
	}
	if nav.ErrorText != "" {
		b.t.Fatalf("load %s: %s", url, nav.ErrorText)
	}
	b.WaitFor(ctx, "the page to load", `document.readyState === "complete"`)
}

// Eval evaluates a JavaScript expression in the page and returns its value
// as JSON.
func (b *Browser) Eval(ctx context.Context, expr string) (json.RawMessage, error) {
	var res struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text string `json:"text"`
		} `json:"exceptionDetails"`
	}
	if err := b.call(ctx, b.session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true}, &res); err != nil {
		return nil, err
	}
	if res.ExceptionDetails != nil {
		return nil, errors.New(res.ExceptionDetails.Text)
	}
	return res.Result.Value, nil
}

// WaitFor polls a JavaScript condition until it is true, failing the test
// when ctx ends first.
func (b *Browser) WaitFor(ctx context.Context, what, cond string) {
	b.t.Helper()
	for {
		v, err := b.Eval(ctx, "!!("+cond+")")
		if err != nil && ctx.Err() != nil {
			b.t.Fatalf("waiting for %s: %v", what, err)
		}
		if string(v) == "true" {
			return
		}
		select {
		case <-ctx.Done():
			b.t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Text returns the page's visible text.
func (b *Browser) Text(ctx context.Context) string {
	b.t.Helper()
	v, err := b.Eval(ctx, "document.body.innerText")
	if err != nil {
		b.t.Fatal(err)
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		b.t.Fatal(err)
	}
	return s
}

// WaitText waits until the page's visible text contains every one of
// subs, and returns it. When ctx ends first it fails the test, showing the
// text it last saw.
func (b *Browser) WaitText(ctx context.Context, subs ...string) string {
	b.t.Helper()
	for {
		text := b.Text(ctx)
		missing := ""
		for _, s := range subs {
			if !strings.Contains(text, s) {
				missing = s
				break
			}
		}
		if missing == "" {
			return text
		}
		select {
		case <-ctx.Done():
			b.t.Fatalf("the page never showed %q: %v; it shows:\n%s", missing, ctx.Err(), text)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Screenshot saves the page, as the 1280×1000 window shows it, as a PNG.
func (b *Browser) Screenshot(ctx context.Context, path string) {
	b.t.Helper()
	var shot struct {
		Data string `json:"data"`
	}
	if err := b.call(ctx, b.session, "Page.captureScreenshot", map[string]any{"format": "png"}, &shot); err != nil {
		b.t.Fatal(err)
	}
	png, err := base64.StdEncoding.DecodeString(shot.Data)
	if err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}
