package handoff

import (
	"bytes"
	"context"
	"fmt"

	"github.com/go-logr/logr"
	"github.com/tidwall/gjson"
	"github.com/tidwall/sjson"

	"github.com/tandem-epp/tandem/internal/wire"
)

// KV connector contracts of the vLLM adapter (AIBRIX_KV_CONNECTOR_TYPE, or the pod label
// model.aibrix.ai/kv-connector-type).
const (
	// ConnectorSHFS: vLLM's NixlConnector-style kv_transfer_params round trip (the default).
	ConnectorSHFS = "shfs"
	// ConnectorNIXL: the decode body carries the whole prefill response as disagg_prefill_resp.
	ConnectorNIXL = "nixl"
)

// prefillKVParams asks vLLM to keep the prompt's KV for a remote decode.
var prefillKVParams = []byte(`{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

var vllmKeys = append([]string{wire.FieldKVTransferParams, wire.FieldDisaggPrefillResp}, prefillKeys...)

// VLLM is the vLLM adapter for one connector. Sync: the decode body needs the prefill response.
type VLLM struct {
	Connector string
	Log       logr.Logger
}

// Name implements Engine.
func (v *VLLM) Name() string { return "vllm/" + v.Connector }

// Prepare implements Engine.
func (v *VLLM) Prepare(_ context.Context, leg *Leg) (*Plan, error) {
	if err := checkControlled(leg.Body, vllmKeys); err != nil {
		return nil, err
	}
	e := newEdit(leg.Body)
	if v.Connector == ConnectorSHFS {
		e.raw(wire.FieldKVTransferParams, prefillKVParams)
	}
	prefill, err := e.prefillOnlyFor(leg.API, true).done()
	if err != nil {
		return nil, fmt.Errorf("building the vLLM prefill body: %w", err)
	}
	return &Plan{PrefillBody: prefill, DecodeBody: leg.Body, BadResponseFails: true}, nil
}

// Merge implements Engine. With shfs, a response without kv_transfer_params leaves the client's
// body as it was: the decode pod then recomputes the prompt, slower but correct, as in the seed.
func (v *VLLM) Merge(leg *Leg, plan *Plan, resp []byte) ([]byte, error) {
	if v.Connector == ConnectorNIXL {
		return newEdit(leg.Body).raw(wire.FieldDisaggPrefillResp, bytes.TrimSpace(resp)).done()
	}
	kv := gjson.GetBytes(resp, wire.FieldKVTransferParams)
	if !kv.IsObject() {
		v.Log.Info("prefill response has no kv_transfer_params object; the decode pod will recompute the prompt",
			"requestID", leg.RequestID, "prefill", leg.Prefill.PodKey(), "got", kv.Type.String())
		return plan.DecodeBody, nil
	}
	params, err := sjson.SetBytes([]byte(kv.Raw), wire.FieldRemoteHost, leg.Prefill.Address)
	if err != nil {
		return nil, fmt.Errorf("setting kv_transfer_params.remote_host: %w", err)
	}
	return newEdit(leg.Body).raw(wire.FieldKVTransferParams, params).done()
}
