"""harness.images: the pinned container images: build, lock files, the image check."""
