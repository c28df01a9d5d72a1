"""Past one machine (the ``[cluster]`` extra): live fleets on Ray Core (``fleet``), archives on Ray
Data (``batch``), durable keypoints in Redis Streams (``bridge``). See docs/DEPLOYMENT.md."""
