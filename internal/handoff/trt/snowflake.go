package trt

import (
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// Layout of a disagg_request_id before it is moved out of TRT's local-id range.
const (
	// Epoch is 2023-01-01T00:00:00Z in Unix milliseconds, the zero of the timestamp field.
	Epoch int64 = 1672531200000
	// MachineIDLimit bounds AIBRIX_TRT_MACHINE_ID: ids are 10 bits, [0, 1024).
	MachineIDLimit = 1 << machineBits
	// MinGlobalID is the smallest id TRT-LLM treats as a global (gateway-issued) request id;
	// smaller values are its own local ids.
	MinGlobalID int64 = 1 << 42

	timestampBits = 41
	machineBits   = 10
	counterBits   = 12
)

// IDs issues disagg_request_id values: [41-bit ms since Epoch][10-bit machine id][12-bit counter],
// then folded into [MinGlobalID, MaxInt64). Gateway processes sharing TRT workers must use
// different machine ids; within one process the counter keeps ids of the same millisecond apart.
// Safe for concurrent use.
type IDs struct {
	machine int64
	counter atomic.Uint64
	now     func() time.Time
}

// NewIDs validates the machine id (AIBRIX_TRT_MACHINE_ID). now may be nil (time.Now).
func NewIDs(machineID int, now func() time.Time) (*IDs, error) {
	if machineID < 0 || machineID >= MachineIDLimit {
		return nil, fmt.Errorf("AIBRIX_TRT_MACHINE_ID=%d: must be in [0, %d); give each gateway process sharing TRT workers its own value", machineID, MachineIDLimit)
	}
	if now == nil {
		now = time.Now
	}
	return &IDs{machine: int64(machineID), now: now}, nil
}

// Next returns a fresh id, always ≥ MinGlobalID.
func (g *IDs) Next() int64 {
	seq := int64((g.counter.Add(1) - 1) & (1<<counterBits - 1))
	return Compose(g.now().UnixMilli()-Epoch, g.machine, seq)
}

// Compose builds the id from its three fields (each masked to its width) and folds it into
// the global range. Exported so tests and the simulator can check the layout by hand.
func Compose(msSinceEpoch, machine, seq int64) int64 {
	raw := (msSinceEpoch&(1<<timestampBits-1))<<(machineBits+counterBits) |
		(machine&(1<<machineBits-1))<<counterBits |
		seq&(1<<counterBits-1)
	return raw%(math.MaxInt64-MinGlobalID) + MinGlobalID
}
