{{/* The release's base name: the release name when it already says tandem, else <release>-tandem. */}}
{{- define "tandem.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 59 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 59 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The EPP's Deployment, Service, ServiceAccount and Role: <fullname>-epp (tandem-epp for release tandem, as manifests/base). */}}
{{- define "tandem.epp" -}}
{{- printf "%s-epp" (include "tandem.fullname" .) -}}
{{- end -}}

{{- define "tandem.poolName" -}}
{{- default (printf "%s-pool" (include "tandem.fullname" .)) .Values.pool.name -}}
{{- end -}}

{{- define "tandem.routeName" -}}
{{- default (printf "%s-route" (include "tandem.fullname" .)) .Values.httpRoute.name -}}
{{- end -}}

{{/* The route's parents: httpRoute.parentRefs, else the Gateway gateway.name in this namespace. */}}
{{- define "tandem.parentRefs" -}}
{{- with .Values.httpRoute.parentRefs }}
{{- toYaml . }}
{{- else -}}
- group: gateway.networking.k8s.io
  kind: Gateway
  name: {{ .Values.gateway.name }}
{{- end }}
{{- end -}}

{{- define "tandem.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tandem.epp" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Selects the EPP's pods. app.kubernetes.io/name is also the ServiceMonitor's job label: tandem-epp. */}}
{{- define "tandem.selectorLabels" -}}
app.kubernetes.io/name: tandem-epp
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tandem.labels" -}}
{{ include "tandem.selectorLabels" . }}
app.kubernetes.io/part-of: tandem
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Whether the chart writes a config file: settings or config given, and no existing ConfigMap. */}}
{{- define "tandem.settings" -}}
{{- $out := dict -}}
{{- range $k, $v := .Values.settings -}}
{{- if not (kindIs "invalid" $v) -}}
{{- $_ := set $out $k $v -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{- define "tandem.configFile" -}}
{{- $settings := include "tandem.settings" . | fromYaml -}}
{{- $doc := dict -}}
{{- with .Values.config.plugins }}{{ $_ := set $doc "plugins" . }}{{ end -}}
{{- with .Values.config.schedulingProfiles }}{{ $_ := set $doc "schedulingProfiles" . }}{{ end -}}
{{- if $settings }}{{ $_ := set $doc "gateway" $settings }}{{ end -}}
{{- if $doc -}}
{{- $_ := set $doc "apiVersion" "inference.networking.x-k8s.io/v1alpha1" -}}
{{- $_ := set $doc "kind" "EndpointPickerConfig" -}}
{{- toYaml $doc -}}
{{- end -}}
{{- end -}}

{{- define "tandem.hasConfig" -}}
{{- if or .Values.config.existingConfigMap (include "tandem.configFile" .) -}}true{{- end -}}
{{- end -}}

{{- define "tandem.configMapName" -}}
{{- default (printf "%s-config" (include "tandem.epp" .)) .Values.config.existingConfigMap -}}
{{- end -}}

{{/* Plaintext ext_proc: tls.secureServing false (every preset's gateway speaks TLS to the EPP). */}}
{{- define "tandem.plaintext" -}}
{{- if not .Values.tls.secureServing -}}true{{- end -}}
{{- end -}}

{{/* --gateway-client: the value's, else the preset's (NGINX Gateway Fabric's shim applies only the destination header), else none (Tandem's default). */}}
{{- define "tandem.gatewayClient" -}}
{{- default (get (dict "nginx-gateway-fabric" "destination-only") .Values.provider.name) .Values.gatewayClient -}}
{{- end -}}

{{/* --destination-fallbacks: the value's (YAML's on/off arrive as booleans), else the preset's
(agentgateway and Envoy AI Gateway's ORIGINAL_DST cluster read one ip:port), else none. */}}
{{- define "tandem.destinationFallbacks" -}}
{{- $v := .Values.destinationFallbacks -}}
{{- if kindIs "bool" $v -}}
{{- ternary "on" "off" $v -}}
{{- else if $v -}}
{{- $v -}}
{{- else -}}
{{- get (dict "envoy-gateway" "off" "kgateway" "off") .Values.provider.name -}}
{{- end -}}
{{- end -}}

{{/* The model the envoy-gateway preset's AIGatewayRoute matches. */}}
{{- define "tandem.aiGatewayModel" -}}
{{- required "provider.envoyGateway.model: name the model the AIGatewayRoute matches (pool.selector has no model.aibrix.ai/name)" (default (get .Values.pool.selector "model.aibrix.ai/name") .Values.provider.envoyGateway.model) -}}
{{- end -}}

{{- define "tandem.gatewayClassName" -}}
{{- if .Values.gateway.className -}}
{{- .Values.gateway.className -}}
{{- else -}}
{{- $classes := dict "envoy-gateway" "envoy-ai-gateway" "kgateway" "agentgateway" "istio" "istio" "nginx-gateway-fabric" "nginx" -}}
{{- required (printf "gateway.className: set the GatewayClass (provider.name %q has no default class)" .Values.provider.name) (get $classes .Values.provider.name) -}}
{{- end -}}
{{- end -}}

{{- define "tandem.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else if toString .Values.image.tag -}}
{{- printf "%s:%s" .Values.image.repository (toString .Values.image.tag) -}}
{{- else -}}
{{- fail "image.tag (or image.digest) is required: Tandem publishes no image yet. Build one with `make image` (or `make release`), push it to your registry, then --set image.repository=<registry>/tandem-epp --set image.tag=<tag>" -}}
{{- end -}}
{{- end -}}
