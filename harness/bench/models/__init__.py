"""The model tier: real models, their step measurement, memory, compile times and reports."""
