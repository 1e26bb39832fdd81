// Pinned wrapper: Longhorn's CustomResourceDefinitions as its manager's published module ships
// them (k8s/crds.yaml). Nothing is built from it: build-binaries.sh downloads the module
// (checked against go.sum) and copies that file, for the suite that gates on Longhorn volumes.
module homelab-autoscaler.invalid/harness/longhorn-crds

go 1.26.0

require github.com/longhorn/longhorn-manager v1.10.0
