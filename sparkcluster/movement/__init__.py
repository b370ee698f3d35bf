"""What moves between nodes: image layers and weights, the one-shot receivers and the senders' framing,
the chain through the workers, and one stream's choreography from the head along them."""
