package picker

// builtins are the picker's plugin types: GIE's and llm-d's non-PD plugins and Tandem's
// own. The PD plugins (llm-d's disaggregation handler and deciders, the seed's cascade)
// are registered by package pd.
func builtins() []Registration {
	return []Registration{
		{Type: TypeSingleProfileHandler, Kind: KindProfileHandler, Origin: OriginBoth, New: newSingleProfileHandler,
			Doc: "Runs the one profile of its strategy; the destination is that profile's ranking."},
		{Type: TypeDecodeRoleFilter, Kind: KindFilter, Origin: OriginTandem, New: newRoleFilter(TypeDecodeRoleFilter),
			Doc: "Drops prefill-only pods (role-name or llm-d.ai/role prefill). Every non-PD strategy also drops them from its destinations."},
		{Type: TypeDecodeFilter, Kind: KindFilter, Origin: OriginLLMD, New: newRoleFilter(TypeDecodeFilter),
			Doc: "Keeps pods that may decode: llm-d.ai/role decode, prefill-decode, both or encode-prefill-decode, or no role label; role-name, when set, wins (anything but prefill)."},
		{Type: TypePrefillFilter, Kind: KindFilter, Origin: OriginLLMD, New: newRoleFilter(TypePrefillFilter),
			Doc: "Keeps pods that may prefill: llm-d.ai/role prefill, encode-prefill, prefill-decode, both or encode-prefill-decode; role-name, when set, wins (prefill only)."},
		{Type: TypeLeastRequestScorer, Kind: KindScorer, Origin: OriginTandem, New: newLeastRequestScorer,
			Doc: "1 − in-flight / max in-flight over the candidates, from the requests Tandem has in flight on each pod."},
		{Type: TypePrefixCacheScorer, Kind: KindScorer, Origin: OriginBoth, Params: prefixCacheParams{}, New: newPrefixCacheScorer,
			Doc: "Share of the prompt's leading blocks a pod holds (llm-d's formula, blended with the match length by matchLengthWeight). Reads a producer's match, or matches the shared prefix index and warms it."},
		{Type: TypeApproxPrefixCacheProducer, Kind: KindDataProducer, Origin: OriginLLMD, Params: approxPrefixParams{}, New: newApproxPrefixProducer,
			Doc: "Matches the prompt against its own approximate prefix index (per-pod LRU bound) before scheduling, and warms it with the chosen pods after."},
		{Type: TypeQueueScorer, Kind: KindScorer, Origin: OriginBoth, New: newMetricScorer(TypeQueueScorer),
			Doc: "(max − waiting) / (max − min) over the candidates' scraped waiting queues; 1 for all when equal."},
		{Type: TypeKVCacheUtilizationScorer, Kind: KindScorer, Origin: OriginBoth, New: newMetricScorer(TypeKVCacheUtilizationScorer),
			Doc: "1 − the pod's scraped KV-cache utilisation (0..1)."},
		{Type: TypeLoadAwareScorer, Kind: KindScorer, Origin: OriginLLMD, Params: loadAwareParams{}, New: newMetricScorer(TypeLoadAwareScorer),
			Doc: "0.5 for an empty waiting queue, else 0.5 × (1 − min(waiting, threshold) / threshold)."},
		{Type: TypeMaxScorePicker, Kind: KindPicker, Origin: OriginBoth, Params: pickerParams{}, New: newPicker(TypeMaxScorePicker),
			Doc: "Highest weighted score first, ties at random."},
		{Type: TypeRandomPicker, Kind: KindPicker, Origin: OriginBoth, Params: pickerParams{}, New: newPicker(TypeRandomPicker),
			Doc: "Uniformly random order."},
	}
}
