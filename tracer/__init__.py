"""Binary trace writer and reader: publication, loss, adoption and allocation events, with
packet sequence numbers, dropped-record counters and an END record that prove integrity."""
