"""Built-in workloads expressed directly as engine tasks (before the model/mapping layers
exist they are what ``npusim run`` simulates)."""
