// The pause program of the real test machines' image: our own, a stand-in for the registry's
// pause image (no registry is reachable in the tests). The standard library only.
module homelab-autoscaler.invalid/harness/pause

go 1.26.0
