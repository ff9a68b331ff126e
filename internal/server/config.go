package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"
)

// Config configures a fenced server.
type Config struct {
	// NodeID names this node in the Raft configuration.
	NodeID string
	// DataDir holds the Raft log, stable store and snapshots.
	DataDir string
	// Listen is the API's TCP address; port 0 picks a free port.
	Listen string
	// DefaultTTL is the TTL of an acquire that names none.
	DefaultTTL time.Duration
	// MinTTL and MaxTTL bound the TTL an acquire may ask for.
	MinTTL, MaxTTL time.Duration
	// Logger receives lease transitions and server events.
	Logger *slog.Logger
}

// DefaultConfig returns the configuration `fenced` starts with.
func DefaultConfig() Config {
	return Config{
		NodeID:     "n1",
		DataDir:    "./fenced-data",
		Listen:     "127.0.0.1:7480",
		DefaultTTL: 10 * time.Second,
		MinTTL:     100 * time.Millisecond,
		MaxTTL:     5 * time.Minute,
		Logger:     slog.Default(),
	}
}

// Validate reports the first problem with c.
func (c Config) Validate() error {
	switch {
	case c.NodeID == "":
		return errors.New("node ID is empty")
	case c.DataDir == "":
		return errors.New("data dir is empty")
	case c.MinTTL <= 0:
		return fmt.Errorf("min TTL %v is not positive", c.MinTTL)
	case c.MaxTTL < c.MinTTL:
		return fmt.Errorf("max TTL %v is below the min TTL %v", c.MaxTTL, c.MinTTL)
	case c.DefaultTTL < c.MinTTL || c.DefaultTTL > c.MaxTTL:
		return fmt.Errorf("default TTL %v is outside [%v, %v]", c.DefaultTTL, c.MinTTL, c.MaxTTL)
	case c.Logger == nil:
		return errors.New("logger is nil")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("listen address %q: %w", c.Listen, err)
	}
	return nil
}
