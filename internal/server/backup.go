package server

import (
	"bufio"
	"context"

	"connectrpc.com/connect"

	fencev1 "github.com/fence-dev/fence/api/fence/v1"
	"github.com/fence-dev/fence/internal/fsm"
	"github.com/fence-dev/fence/internal/wire"
)

// backupChunk is the size of one message of a Backup stream.
const backupChunk = 256 << 10

// Backup implements fence.v1.ClusterService.Backup. It runs on the leader
// (followers forward it), which first confirms that it still leads, so the
// backup holds every grant acknowledged before the call; it freezes the
// state, as a Raft snapshot does, and writes it while commands go on being
// applied.
func (c cluster) Backup(ctx context.Context, _ *connect.Request[fencev1.BackupRequest], stream *connect.ServerStream[fencev1.BackupResponse]) error {
	if err := c.s.checkReady(); err != nil {
		return wire.ToConnect(err)
	}
	// A leader deposed without noticing yet would send a state that lacks
	// the new leader's grants. ConfirmLeader rather than Get's
	// VerifyLeader: it also holds for a leader paused with a heartbeat in
	// flight, and a backup is rare enough to pay for its log entry.
	if err := c.s.node.ConfirmLeader(ctx); err != nil {
		return wire.ToConnect(err)
	}
	var f *fsm.Frozen
	c.s.node.Read(func(st *fsm.State) { f = st.Freeze() })
	w := bufio.NewWriterSize(chunkWriter{stream}, backupChunk)
	n, err := f.WriteTo(w)
	if err == nil {
		err = w.Flush()
	}
	if err != nil {
		return err
	}
	c.s.log.Info("backup sent", "bytes", n)
	return nil
}

// chunkWriter sends what is written to it as Backup messages.
type chunkWriter struct {
	stream *connect.ServerStream[fencev1.BackupResponse]
}

func (w chunkWriter) Write(p []byte) (int, error) {
	if err := w.stream.Send(&fencev1.BackupResponse{Chunk: p}); err != nil {
		return 0, err
	}
	return len(p), nil
}
